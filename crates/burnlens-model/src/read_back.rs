//! Tensors read back to the host several at once: on a GPU each read waits for everything
//! enqueued before it, so a step or a batch that needs several results reads them in one.

use burn::tensor::Tensor;

/// The values of `parts` (each flattened, f32 or any float dtype), read back in one read and
/// handed out in the same order.
pub fn read_together(parts: Vec<Tensor<1>>) -> Vec<Vec<f32>> {
    let lens: Vec<usize> = parts.iter().map(|p| p.dims()[0]).collect();
    let all: Vec<f32> = Tensor::cat(parts, 0).into_data().convert::<f32>().try_into_vec::<f32>().expect("values read back as f32");
    let mut rest = all.as_slice();
    lens.into_iter()
        .map(|n| {
            let (part, tail) = rest.split_at(n);
            rest = tail;
            part.to_vec()
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use burn::tensor::{Device, TensorData};

    #[test]
    fn parts_come_back_whole_and_in_order() {
        let device = Device::default();
        let t = |v: Vec<f32>| Tensor::<1>::from_data(TensorData::new(v.clone(), [v.len()]), &device);
        let got = read_together(vec![t(vec![1.0, 2.0]), t(vec![3.0]), t(vec![4.0, 5.0, 6.0])]);
        assert_eq!(got, vec![vec![1.0, 2.0], vec![3.0], vec![4.0, 5.0, 6.0]]);
    }
}
