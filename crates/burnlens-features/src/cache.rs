//! An activation cache on disk: what model passes produced at some hook points, kept so that
//! SAEs can be trained again without the model. A folder of
//!
//! ```text
//! cache.json              {"format": "burnlens-activations/1", "hooks": [...], "widths": [...],
//!                          "context_size": T, "windows_per_chunk": B, "complete": bool,
//!                          "shards": [{"file": "shard_00000.safetensors", "chunks": C}, ...]}
//! shard_00000.safetensors one f32 tensor per hook, named by the hook, [C·B·T, width]: C model
//!                          passes of B windows of T tokens, row = (window, position)
//! ```
//!
//! Shards are written atomically and `cache.json` after each, so an interrupted cache resumes
//! after its last shard. Writing and reading hold one shard in memory (`chunks_per_shard`
//! passes: C·B·T rows of the hooks' widths in f32), besides the store's mixing buffer. A chunk is one model pass, the unit the store's mixing buffer
//! receives, so training from a cache sees exactly the rows (and, with the same seed, the
//! batches) that training from the model sees.

use std::path::{Path, PathBuf};

use burnlens_data::WindowPosition;
use burnlens_model::{HookPoint, Transformer};
use safetensors::Dtype;
use serde::{Deserialize, Serialize};

use crate::pass::{StoreError, WindowSource, pass};

fn file_err(path: &Path, e: impl std::fmt::Display) -> StoreError {
    StoreError::Config(format!("{}: {e}", path.display()))
}

/// The cache's `format` field.
pub const FORMAT: &str = "burnlens-activations/1";
const INDEX: &str = "cache.json";

/// One shard file and the model passes it holds.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Shard {
    pub file: String,
    pub chunks: usize,
}

/// `cache.json`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CacheIndex {
    pub format: String,
    pub hooks: Vec<String>,
    pub widths: Vec<usize>,
    pub context_size: usize,
    pub windows_per_chunk: usize,
    pub complete: bool,
    pub shards: Vec<Shard>,
    /// Where the corpus's windows stood after the last shard (an interrupted cache seeks
    /// there to continue).
    #[serde(default)]
    pub position: WindowPosition,
}

impl CacheIndex {
    /// Read `dir/cache.json`, checking its format.
    pub fn read(dir: &Path) -> Result<Self, StoreError> {
        let path = dir.join(INDEX);
        let text = std::fs::read_to_string(&path).map_err(|e| file_err(&path, format!("cannot read the activation cache's index: {e}")))?;
        let index: CacheIndex = serde_json::from_str(&text).map_err(|e| file_err(&path, format!("not an activation cache index: {e}")))?;
        if index.format != FORMAT {
            return Err(file_err(&path, format!("format `{}`, expected `{FORMAT}`", index.format)));
        }
        if index.hooks.len() != index.widths.len() || index.hooks.is_empty() {
            return Err(file_err(&path, "`hooks` and `widths` must name the same hooks, at least one"));
        }
        Ok(index)
    }

    fn write(&self, dir: &Path) -> Result<(), StoreError> {
        let path = dir.join(INDEX);
        Ok(burnlens_model::files::write_atomic(&path, serde_json::to_string_pretty(self).expect("index serialises").as_bytes())?)
    }

    /// Model passes held.
    pub fn chunks(&self) -> usize {
        self.shards.iter().map(|s| s.chunks).sum()
    }
}

/// What to cache.
pub struct CacheJob<'a> {
    pub model: &'a Transformer,
    pub hooks: Vec<HookPoint>,
    pub context_size: usize,
    /// Windows per model pass.
    pub windows_per_chunk: usize,
    /// Model passes per shard file.
    pub chunks_per_shard: usize,
    /// Stop after this many windows (all of the corpus when `None`).
    pub max_windows: Option<u64>,
    /// The processes sharing the work (this one alone by default).
    pub ranks: burnlens_dist::Ranks,
}

/// Write (or continue) the cache in `dir` from `windows`; `progress(windows_done)` after each
/// round of shards. Returns the index written.
///
/// Over several ranks (`job.ranks`), every rank reads every window, and in each round of
/// shards rank r computes and writes the round's r-th shard; once all are written (the ranks
/// agree), rank 0 adds them to `cache.json`. The files are those one process writes, so a
/// later run reads the cache with any number of ranks.
pub fn write_cache(dir: &Path, job: &CacheJob, mut windows: WindowSource, progress: &mut dyn FnMut(u64)) -> Result<CacheIndex, StoreError> {
    let names: Vec<String> = job.hooks.iter().map(|h| h.name()).collect();
    let probe = pass(job.model, &job.hooks, &[vec![0; 2]])?;
    let widths: Vec<usize> = probe.iter().map(|t| t.dims()[1]).collect();
    std::fs::create_dir_all(dir).map_err(|e| file_err(dir, e))?;
    let fresh = CacheIndex {
        format: FORMAT.into(),
        hooks: names.clone(),
        widths: widths.clone(),
        context_size: job.context_size,
        windows_per_chunk: job.windows_per_chunk,
        complete: false,
        shards: Vec::new(),
        position: WindowPosition::default(),
    };
    let mut index = match CacheIndex::read(dir) {
        Ok(old) if CacheIndex { complete: false, shards: Vec::new(), position: WindowPosition::default(), ..old.clone() } == fresh => old,
        Ok(_) => return Err(file_err(&dir.join(INDEX), "this folder holds a cache of other hooks or windows; use a new folder")),
        Err(_) => fresh,
    };
    if index.complete {
        return Ok(index);
    }
    // The corpus seeks to where the last shard ended.
    if index.chunks() > 0 && index.position.windows == 0 {
        return Err(file_err(&dir.join(INDEX), "an unfinished cache of an older burnlens (no position to continue from); use a new folder"));
    }
    windows.seek(&index.position)?;
    let mut read = index.position.windows;
    while !index.complete {
        let mut round = Vec::new();
        let mut mine = Ok(());
        for r in 0..job.ranks.size() {
            let compute = r == job.ranks.rank();
            let (rows, chunks) = read_shard(job, &mut windows, &mut read, compute, &mut index.complete)?;
            if chunks > 0 {
                let file = format!("shard_{:05}.safetensors", index.shards.len() + round.len());
                if compute {
                    mine = write_shard(&dir.join(&file), &names, &widths, &rows);
                }
                round.push(Shard { file, chunks });
            }
            if index.complete {
                break;
            }
        }
        let shared = job.ranks.agree(mine.as_ref().map(|_| ()).map_err(|e| e.to_string()));
        mine?;
        shared?;
        index.shards.extend(round);
        index.position = windows.cursor();
        if job.ranks.is_writer() {
            index.write(dir)?;
        }
        progress(read);
    }
    Ok(index)
}

/// The next shard's windows (up to `chunks_per_shard` model passes), and with `compute` their
/// activations, each hook's rows; `complete` is set when the windows run out.
fn read_shard(job: &CacheJob, windows: &mut WindowSource, read: &mut u64, compute: bool, complete: &mut bool) -> Result<(Vec<Vec<f32>>, usize), StoreError> {
    let mut rows: Vec<Vec<f32>> = vec![Vec::new(); job.hooks.len()];
    let mut chunks = 0;
    while chunks < job.chunks_per_shard {
        let want = job.max_windows.map_or(job.windows_per_chunk as u64, |m| m.saturating_sub(*read).min(job.windows_per_chunk as u64)) as usize;
        let batch: Vec<Vec<u32>> = windows.by_ref().take(want).collect::<Result<_, _>>().map_err(StoreError::from)?;
        *read += batch.len() as u64;
        if !batch.is_empty() {
            if compute {
                for (r, a) in rows.iter_mut().zip(pass(job.model, &job.hooks, &batch)?) {
                    r.extend(a.into_data().try_into_vec_as::<f32>().expect("f32"));
                }
            }
            chunks += 1;
        }
        if batch.len() < job.windows_per_chunk {
            *complete = true;
            break;
        }
    }
    Ok((rows, chunks))
}

fn write_shard(path: &Path, names: &[String], widths: &[usize], rows: &[Vec<f32>]) -> Result<(), StoreError> {
    use burnlens_model::files::{FileTensor, f32_bytes, write_safetensors};
    let bytes: Vec<Vec<u8>> = rows.iter().map(|r| f32_bytes(r)).collect();
    let tensors: Vec<FileTensor> =
        names.iter().zip(widths).zip(&bytes).map(|((n, &w), b)| FileTensor { name: n, dtype: Dtype::F32, shape: vec![b.len() / 4 / w, w], bytes: b }).collect();
    Ok(write_safetensors(path, &tensors, None)?)
}

/// Reads a cache back one model pass (chunk) at a time, the hooks asked for side by side.
pub struct CacheReader {
    dir: PathBuf,
    index: CacheIndex,
    /// Which of the cache's hooks, in the order asked for.
    columns: Vec<usize>,
    shard: usize,
    /// The current shard's chunks, each the asked hooks' rows side by side.
    pending: std::collections::VecDeque<Vec<f32>>,
    /// Chunks handed out so far.
    pub chunks_read: u64,
}

impl CacheReader {
    /// A reader of `hooks` from the cache in `dir`, refusing hooks it does not hold.
    pub fn open(dir: &Path, hooks: &[String]) -> Result<Self, StoreError> {
        let index = CacheIndex::read(dir)?;
        let columns = hooks
            .iter()
            .map(|h| {
                index
                    .hooks
                    .iter()
                    .position(|c| c == h)
                    .ok_or_else(|| file_err(&dir.join(INDEX), format!("holds no activations of `{h}` (it has {})", index.hooks.join(", "))))
            })
            .collect::<Result<Vec<_>, _>>()?;
        Ok(CacheReader { dir: dir.to_path_buf(), index, columns, shard: 0, pending: Default::default(), chunks_read: 0 })
    }

    pub fn index(&self) -> &CacheIndex {
        &self.index
    }

    /// The widths of the hooks asked for.
    pub fn widths(&self) -> Vec<usize> {
        self.columns.iter().map(|&c| self.index.widths[c]).collect()
    }

    /// Go past the first `chunks` chunks (from the start): the shards before them are not
    /// read.
    pub fn seek(&mut self, chunks: u64) -> Result<(), StoreError> {
        if self.chunks_read != 0 || self.shard != 0 {
            return Err(StoreError::Config("an activation cache seeks from its start only".into()));
        }
        let mut left = chunks;
        while let Some(shard) = self.index.shards.get(self.shard).filter(|s| (s.chunks as u64) <= left) {
            left -= shard.chunks as u64;
            self.shard += 1;
        }
        self.chunks_read = chunks - left;
        for _ in 0..left {
            self.next_chunk()?.ok_or_else(|| StoreError::Config(format!("the cache holds fewer than the {chunks} passes this run had read")))?;
        }
        Ok(())
    }

    /// The next chunk's rows, or `None` after the last.
    pub fn next_chunk(&mut self) -> Result<Option<Vec<f32>>, StoreError> {
        while self.pending.is_empty() {
            let Some(shard) = self.index.shards.get(self.shard).cloned() else { return Ok(None) };
            self.shard += 1;
            self.load(&shard)?;
        }
        self.chunks_read += 1;
        Ok(self.pending.pop_front())
    }

    fn load(&mut self, shard: &Shard) -> Result<(), StoreError> {
        let path = self.dir.join(&shard.file);
        let bad = |msg: String| StoreError::Config(format!("{}: {msg}", path.display()));
        let bytes = std::fs::read(&path).map_err(|e| bad(format!("cannot read: {e}")))?;
        let st = safetensors::SafeTensors::deserialize(&bytes).map_err(|e| bad(format!("not a readable shard: {e}")))?;
        let per_chunk = self.index.windows_per_chunk * self.index.context_size;
        let mut columns: Vec<(usize, Vec<f32>)> = Vec::new();
        for &c in &self.columns {
            let (name, width) = (&self.index.hooks[c], self.index.widths[c]);
            let t = st.tensor(name).map_err(|_| bad(format!("has no tensor `{name}`")))?;
            if t.shape().len() != 2 || t.shape()[1] != width || t.dtype() != Dtype::F32 {
                return Err(bad(format!("tensor `{name}` is {:?} {:?}, the index says f32 [rows, {width}]", t.dtype(), t.shape())));
            }
            columns.push((width, t.data().chunks_exact(4).map(|b| f32::from_le_bytes(b.try_into().expect("4 bytes"))).collect()));
        }
        let rows = columns[0].1.len() / columns[0].0;
        let mut start = 0;
        while start < rows {
            let n = per_chunk.min(rows - start);
            let mut chunk = Vec::with_capacity(n * columns.iter().map(|c| c.0).sum::<usize>());
            for r in start..start + n {
                for (w, v) in &columns {
                    chunk.extend_from_slice(&v[r * w..(r + 1) * w]);
                }
            }
            self.pending.push_back(chunk);
            start += n;
        }
        Ok(())
    }
}
