//! The first pass's encoder inputs kept on disk, so that the second pass reads them instead of
//! running the model again (the model is most of a pass's time on a real model). Raw f32, in
//! the first pass's order and batches, each batch's inputs one after another; used only when
//! the whole corpus's inputs fit the budget, and only by a run whose first pass ran in one
//! go (a resumed run runs the model again: the file is not part of the checkpoint).

use std::fs::File;
use std::io::{BufReader, BufWriter, Read, Write};
use std::path::{Path, PathBuf};

use burn::tensor::{Device, Tensor, TensorData};

use crate::error::DashboardError;

pub struct Spill {
    path: PathBuf,
    writer: Option<BufWriter<File>>,
    reader: Option<BufReader<File>>,
}

impl Spill {
    /// A new spill file at `path` (any old one replaced).
    pub fn create(path: &Path) -> Result<Self, DashboardError> {
        let f = File::create(path).map_err(|e| DashboardError::io(path, e))?;
        Ok(Spill { path: path.to_path_buf(), writer: Some(BufWriter::with_capacity(1 << 22, f)), reader: None })
    }

    /// Appends one batch's inputs.
    pub fn write(&mut self, inputs: &[Tensor<2>]) -> Result<(), DashboardError> {
        let w = self.writer.as_mut().expect("a spill being written");
        for x in inputs {
            let v = x.clone().into_data().try_to_vec::<f32>().map_err(|e| DashboardError::Input(format!("encoder inputs: {e:?}")))?;
            let bytes: Vec<u8> = v.iter().flat_map(|f| f.to_le_bytes()).collect();
            w.write_all(&bytes).map_err(|e| DashboardError::io(&self.path, e))?;
        }
        Ok(())
    }

    /// Ends the writing; the batches are read back from the start.
    pub fn rewind(&mut self) -> Result<(), DashboardError> {
        if let Some(mut w) = self.writer.take() {
            w.flush().map_err(|e| DashboardError::io(&self.path, e))?;
        }
        let f = File::open(&self.path).map_err(|e| DashboardError::io(&self.path, e))?;
        self.reader = Some(BufReader::with_capacity(1 << 22, f));
        Ok(())
    }

    /// The next batch's inputs: `rows` rows of each width in `widths`.
    pub fn read(&mut self, rows: usize, widths: &[usize], device: &Device) -> Result<Vec<Tensor<2>>, DashboardError> {
        let r = self.reader.as_mut().expect("a rewound spill");
        widths
            .iter()
            .map(|&w| {
                let mut bytes = vec![0u8; rows * w * 4];
                r.read_exact(&mut bytes).map_err(|e| DashboardError::io(&self.path, format!("the spilled inputs end early: {e}")))?;
                let v: Vec<f32> = bytes.chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect();
                Ok(Tensor::from_data(TensorData::new(v, [rows, w]), device))
            })
            .collect()
    }
}

impl Drop for Spill {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}
