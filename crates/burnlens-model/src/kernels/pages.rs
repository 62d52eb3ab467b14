//! Buffers on huge pages for long-lived data that is streamed from memory: packed f32
//! weights, half weights converted at load, and (as flex tensors, [`into_bytes`]) AdamW's
//! moments, which also stay out of the heap that way (born in it in the first step, they
//! took the space the freed activations left, and the second step faulted 199,000 fresh
//! pages for GPT-2 small; 9,500 now).
//!
//! Decoding reads every weight once per token, hundreds of megabytes in address order; with
//! 4 KB pages that is a TLB miss every 4 KB (the Zen 4 machine's second-level TLB covers 12
//! MB). A [`PageBuf`] from 2 MB on is an anonymous mapping of its own, advised for
//! transparent huge pages before it is first written, so that reading it walks 2 MB pages.
//! Measured on the 2-core Zen 4 machine (GPT-2 small, `bench generate`, alternating runs):
//! glibc's `hugetlb` tunable putting every heap block on huge pages made decoding 8–11%
//! faster in 6 of 6 pairs with bf16 weights and in 5 of 6 with f32; with only the packed f32
//! weights and the converted half weights in these buffers, faster in 10 of 10 pairs (both
//! dtypes, 1–15%). The kernel's `transparent_hugepage` setting decides (the common `madvise`
//! honours the advice; `never` ignores it, which costs nothing).

use std::mem::MaybeUninit;

use burn::tensor::{AllocationProperty, Bytes};
use burn_std::{AccessError, AccessPolicy, AllocationController};

/// Below this size a buffer is an ordinary vector: a mapping of its own would not fill one
/// huge page.
const HUGE_PAGE: usize = 2 << 20;

/// Element types a [`PageBuf`] may hold: plain numbers for which all-zero bits are zero
/// and every bit pattern is a value.
///
/// # Safety
/// Implement only for such types.
pub unsafe trait Plain: Copy + Send + Sync + 'static {
    /// All bits zero.
    const ZERO: Self;
}
// SAFETY: plain numbers, every bit pattern valid, zero bits are 0.
unsafe impl Plain for f32 {
    const ZERO: Self = 0.0;
}
unsafe impl Plain for u16 {
    const ZERO: Self = 0;
}
unsafe impl Plain for u32 {
    const ZERO: Self = 0;
}
unsafe impl Plain for burn::tensor::bf16 {
    const ZERO: Self = burn::tensor::bf16::ZERO;
}
unsafe impl Plain for burn::tensor::f16 {
    const ZERO: Self = burn::tensor::f16::ZERO;
}

/// A zeroed buffer of `T`s: a vector below [`HUGE_PAGE`] bytes (or off Linux), a mapping on
/// huge pages above.
pub enum PageBuf<T: Plain> {
    Vec(Vec<T>),
    #[cfg(target_os = "linux")]
    Map(memmap2::MmapMut, usize),
}

impl<T: Plain> PageBuf<T> {
    /// `len` zeros.
    pub fn zeroed(len: usize) -> Self {
        let bytes = len * std::mem::size_of::<T>();
        #[cfg(target_os = "linux")]
        if bytes >= HUGE_PAGE
            && let Ok(map) = memmap2::MmapMut::map_anon(bytes)
        {
            // Advice only: without transparent huge pages the mapping keeps 4 KB pages.
            let _ = map.advise(memmap2::Advice::HugePage);
            return Self::Map(map, len);
        }
        let _ = bytes;
        // `vec!` of a zero f32 or u16 asks the allocator for zeroed memory (no pass over it).
        Self::Vec(vec![T::ZERO; len])
    }

    /// A copy of `values` in such a buffer.
    pub fn copy_of(values: &[T]) -> Self {
        let mut buf = Self::zeroed(values.len());
        buf.copy_from_slice(values);
        buf
    }
}

impl<T: Plain> std::ops::Deref for PageBuf<T> {
    type Target = [T];
    fn deref(&self) -> &[T] {
        match self {
            Self::Vec(v) => v,
            // SAFETY: the mapping is page-aligned and `len` elements long; any bits are a `T`.
            #[cfg(target_os = "linux")]
            Self::Map(m, len) => unsafe { std::slice::from_raw_parts(m.as_ptr().cast::<T>(), *len) },
        }
    }
}

impl<T: Plain> std::ops::DerefMut for PageBuf<T> {
    fn deref_mut(&mut self) -> &mut [T] {
        match self {
            Self::Vec(v) => v,
            // SAFETY: as above, and `&mut self` makes the access exclusive.
            #[cfg(target_os = "linux")]
            Self::Map(m, len) => unsafe { std::slice::from_raw_parts_mut(m.as_mut_ptr().cast::<T>(), *len) },
        }
    }
}

impl<T: Plain> AsRef<[u8]> for PageBuf<T> {
    fn as_ref(&self) -> &[u8] {
        let v: &[T] = self;
        // SAFETY: plain numbers have no padding; the bytes are exactly the elements'.
        unsafe { std::slice::from_raw_parts(v.as_ptr().cast::<u8>(), std::mem::size_of_val(v)) }
    }
}

/// A [`PageBuf`] as the storage of a Burn tensor, written in place like a vector's (no
/// copy-on-write: the buffer is the tensor's own).
struct PageStorage<T: Plain>(PageBuf<T>);

impl<T: Plain> AllocationController for PageStorage<T> {
    fn alloc_align(&self) -> usize {
        match &self.0 {
            PageBuf::Vec(_) => std::mem::align_of::<T>(),
            #[cfg(target_os = "linux")]
            PageBuf::Map(..) => 4096,
        }
    }

    fn property(&self) -> AllocationProperty {
        AllocationProperty::Native
    }

    unsafe fn memory_mut(&mut self, _: AccessPolicy) -> Result<&mut [MaybeUninit<u8>], AccessError> {
        let v: &mut [T] = &mut self.0;
        // SAFETY: the elements' bytes, initialised; callers write only initialised bytes.
        Ok(unsafe { std::slice::from_raw_parts_mut(v.as_mut_ptr().cast::<MaybeUninit<u8>>(), std::mem::size_of_val(v)) })
    }

    fn memory(&self, _: AccessPolicy) -> Result<&[MaybeUninit<u8>], AccessError> {
        let v: &[T] = &self.0;
        // SAFETY: as above.
        Ok(unsafe { std::slice::from_raw_parts(v.as_ptr().cast::<MaybeUninit<u8>>(), std::mem::size_of_val(v)) })
    }
}

/// `buf` as Burn bytes that own it.
pub fn into_bytes<T: Plain>(buf: PageBuf<T>) -> Bytes {
    let len = std::mem::size_of_val::<[T]>(&buf);
    // SAFETY: the controller serves exactly `len` initialised bytes (a zeroed or filled
    // buffer), for as long as it lives.
    unsafe { Bytes::from_controller(Box::new(PageStorage(buf)), len) }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_page_buffer_is_zeroed_writable_and_its_bytes_are_its_elements() {
        // Above the huge-page size (a mapping of its own on Linux) and below it (a vector).
        for len in [3 << 20, 1000] {
            let mut buf = PageBuf::<f32>::zeroed(len);
            assert_eq!(buf.len(), len);
            assert!(buf.iter().all(|&v| v == 0.0), "{len}: not zeroed");
            buf[len - 1] = 2.5;
            buf[0] = -1.0;
            let bytes: &[u8] = buf.as_ref();
            assert_eq!(bytes.len(), len * 4);
            assert_eq!(bytes[..4], (-1.0f32).to_le_bytes());
            assert_eq!(bytes[bytes.len() - 4..], 2.5f32.to_le_bytes());
            #[cfg(target_os = "linux")]
            assert_eq!(matches!(buf, PageBuf::Map(..)), len * 4 >= HUGE_PAGE, "{len}: the wrong kind of buffer");
        }
        let halves: Vec<u16> = (0..(1u32 << 21)).map(|i| (i * 7) as u16).collect();
        assert_eq!(&*PageBuf::copy_of(&halves), &halves[..]);
    }

    #[test]
    fn a_tensor_on_a_page_buffer_is_written_in_place_and_copied_when_shared() {
        use burn::backend::flex::{FlexTensor, Layout};
        use burn::tensor::{DType, Shape};
        for len in [1 << 20, 100] {
            let mut t = FlexTensor::new(into_bytes(PageBuf::<f32>::zeroed(len)), Layout::contiguous(Shape::from(vec![len])), DType::F32);
            let at = t.storage::<f32>().as_ptr();
            let shared = t.clone();
            // Shared: a copy is written, the original stays zero.
            let mut copy = t.clone();
            copy.storage_mut::<f32>()[3] = 1.0;
            assert_eq!(shared.storage::<f32>()[3], 0.0, "{len}: the shared buffer was written");
            drop((shared, copy));
            // Its own again: written where it lies.
            let v = super::super::flex::owned_f32(&mut t).expect("an unshared tensor is writable");
            v[len - 1] = 4.0;
            assert_eq!(v.as_ptr(), at, "{len}: written elsewhere");
            assert_eq!(t.storage::<f32>()[len - 1], 4.0);
        }
    }
}
