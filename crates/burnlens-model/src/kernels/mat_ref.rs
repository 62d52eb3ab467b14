//! The strided matrix view every product reads its operands through (re-exported by
//! [`super::gemm`], where the products take it).

/// A strided read-only matrix view: element `(i, j)` is `data[offset + i·rs + j·cs]`.
#[derive(Clone, Copy, Debug)]
pub struct MatRef<'a> {
    pub data: &'a [f32],
    pub offset: usize,
    pub rows: usize,
    pub cols: usize,
    pub rs: isize,
    pub cs: isize,
}

impl<'a> MatRef<'a> {
    /// A row-major `[rows, cols]` matrix starting at `data[0]`.
    pub fn row_major(data: &'a [f32], rows: usize, cols: usize) -> Self {
        Self { data, offset: 0, rows, cols, rs: cols as isize, cs: 1 }
    }

    /// The transpose (a view: no copy).
    pub fn t(self) -> Self {
        Self { rows: self.cols, cols: self.rows, rs: self.cs, cs: self.rs, ..self }
    }

    /// Rows `r0..r0 + n`.
    pub fn rows(self, r0: usize, n: usize) -> Self {
        assert!(r0 + n <= self.rows, "MatRef::rows: {r0}+{n} of {}", self.rows);
        Self { offset: (self.offset as isize + r0 as isize * self.rs) as usize, rows: n, ..self }
    }

    /// Columns `c0..c0 + n`.
    pub fn cols(self, c0: usize, n: usize) -> Self {
        assert!(c0 + n <= self.cols, "MatRef::cols: {c0}+{n} of {}", self.cols);
        Self { offset: (self.offset as isize + c0 as isize * self.cs) as usize, cols: n, ..self }
    }

    /// Panics unless every element lies inside `data`.
    pub(crate) fn check(&self) {
        check_view([self.offset, self.rows, self.cols], [self.rs, self.cs], self.data.len());
    }

    /// The values of row `r`, in column order (read through the strides).
    pub(crate) fn row_values(&self, r: usize) -> impl Iterator<Item = f32> + '_ {
        let start = self.offset as isize + r as isize * self.rs;
        (0..self.cols).map(move |i| self.data[(start + i as isize * self.cs) as usize])
    }
}

/// Panics unless every element of the strided view `[offset, rows, cols]`, `[rs, cs]` lies
/// inside a buffer of `len` elements.
pub(crate) fn check_view([offset, rows, cols]: [usize; 3], [rs, cs]: [isize; 2], len: usize) {
    if rows == 0 || cols == 0 {
        return;
    }
    let last = |n: usize, s: isize| (n as isize - 1) * s;
    let (lo, hi) = [last(rows, rs), last(cols, cs)].iter().fold((0isize, 0isize), |(lo, hi), &e| (lo + e.min(0), hi + e.max(0)));
    let start = offset as isize;
    assert!(start + lo >= 0 && ((start + hi) as usize) < len, "matrix view out of bounds");
}
