//! Models by Hugging Face Hub id (`gpt2`, `EleutherAI/pythia-70m`, `org/name@revision`),
//! downloaded into the cache layout Python's `huggingface_hub` uses, so both share one cache:
//!
//! ```text
//! $HF_HUB_CACHE (or $HF_HOME/hub, or ~/.cache/huggingface/hub)
//!   models--org--name/
//!     refs/main                      the commit a branch or tag resolved to
//!     blobs/<etag>                   file contents, named by the hash the server announces
//!     snapshots/<commit>/<file>      symlinks to ../../blobs/<etag>
//! ```
//!
//! Only what a causal LM needs is fetched: `config.json`, the tokenizer files that exist,
//! and the weights (`model.safetensors`, or the shards an index names, or
//! `pytorch_model.bin`). Each file is written to `blobs/<etag>.incomplete` (resumed with an
//! HTTP range request if a previous attempt stopped), checked against the size and hash the
//! server announced (sha256 for LFS files, the git blob sha1 for small ones), and only then
//! renamed into place: a failed or corrupt download never leaves a file that looks complete.
//! A cached model loads without the network; `HF_HUB_OFFLINE=1` forbids it altogether.
//! `HF_ENDPOINT` points at another server (the tests run one on 127.0.0.1), `HF_TOKEN`
//! authorises gated and private repositories.

use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;
use sha2::Digest;

use crate::error::{HfError, Result};

pub use crate::hub_id::{HubId, RepoKind};

/// What a download reports as it goes; the CLI draws a progress bar from it.
#[derive(Debug, Clone)]
pub enum Progress<'a> {
    /// A file starts downloading: its name, size and how much is already there (resume).
    Start { file: &'a str, size: u64, resumed_from: u64 },
    /// Bytes received so far for the current file.
    Advance { bytes: u64 },
    /// The current file is complete and verified.
    Done { file: &'a str },
    /// Using the cache, with why (offline, or the server could not be reached).
    Cached { reason: String },
}

/// Where and how to talk to the Hub.
#[derive(Debug, Clone)]
pub struct Hub {
    pub endpoint: String,
    pub cache: PathBuf,
    pub token: Option<String>,
    pub offline: bool,
}

/// The files of a repository revision as the API lists them.
#[derive(Deserialize)]
struct RepoInfo {
    sha: String,
    #[serde(default)]
    siblings: Vec<Sibling>,
}

#[derive(Deserialize)]
struct Sibling {
    rfilename: String,
}

/// Files fetched when present besides config and weights.
const OPTIONAL_FILES: &[&str] =
    &["generation_config.json", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "vocab.json", "merges.txt", "char_vocab.json"];

impl Hub {
    /// Settings from the environment: `HF_ENDPOINT` (default `https://huggingface.co`),
    /// `HF_HUB_CACHE`, else `HF_HOME/hub`, else `~/.cache/huggingface/hub`; `HF_TOKEN`;
    /// `HF_HUB_OFFLINE` (`1`, `true`, `yes`, `on`).
    pub fn from_env() -> Self {
        let var = |k: &str| std::env::var(k).ok().filter(|v| !v.trim().is_empty());
        let cache = var("HF_HUB_CACHE").map(PathBuf::from).unwrap_or_else(|| {
            let home = var("HF_HOME").map(PathBuf::from).unwrap_or_else(|| {
                let user = var("HOME").map(PathBuf::from).unwrap_or_else(|| PathBuf::from("."));
                var("XDG_CACHE_HOME").map(PathBuf::from).unwrap_or_else(|| user.join(".cache")).join("huggingface")
            });
            home.join("hub")
        });
        let offline = var("HF_HUB_OFFLINE").is_some_and(|v| matches!(v.to_ascii_lowercase().as_str(), "1" | "true" | "yes" | "on"));
        Hub {
            endpoint: var("HF_ENDPOINT").unwrap_or_else(|| "https://huggingface.co".into()).trim_end_matches('/').to_string(),
            cache,
            token: var("HF_TOKEN"),
            offline,
        }
    }

    /// The snapshot directory of `id` holding everything a model needs, downloading what is
    /// missing.
    pub fn fetch(&self, id: &HubId, progress: &mut dyn FnMut(Progress)) -> Result<PathBuf> {
        let repo_dir = self.cache.join(id.cache_name());
        if self.offline {
            let snap = self.cached_snapshot(id, &repo_dir)?;
            progress(Progress::Cached { reason: "HF_HUB_OFFLINE is set".into() });
            return Ok(snap);
        }
        let info = match self.repo_info(id) {
            Ok(info) => info,
            Err(HubFailure::Unreachable(why)) => {
                // As huggingface_hub does: no network, but a complete snapshot is cached.
                let snap = self.cached_snapshot(id, &repo_dir).map_err(|_| {
                    self.err(id, format!("cannot reach {}: {why}; the model is not in the cache {} either", self.endpoint, self.cache.display()))
                })?;
                progress(Progress::Cached { reason: format!("{} unreachable ({why})", self.endpoint) });
                return Ok(snap);
            }
            Err(HubFailure::Error(e)) => return Err(e),
        };
        let commit = info.sha.clone();
        let snap = repo_dir.join("snapshots").join(&commit);
        std::fs::create_dir_all(&snap).map_err(|e| HfError::io(&snap, e))?;
        let names: Vec<&str> = info.siblings.iter().map(|s| s.rfilename.as_str()).collect();
        let has = |f: &str| names.contains(&f);
        if !has("config.json") {
            return Err(self.err(id, "has no config.json; expected a transformers model repository".into()));
        }
        let mut files: Vec<String> = vec!["config.json".into()];
        files.extend(OPTIONAL_FILES.iter().filter(|f| has(f)).map(|f| f.to_string()));
        let index = ["model.safetensors", "model.safetensors.index.json", "pytorch_model.bin", "pytorch_model.bin.index.json"].into_iter().find(|f| has(f));
        let Some(weights) = index else {
            return Err(self.err(
                id,
                "has no weights: expected model.safetensors, model.safetensors.index.json, pytorch_model.bin or pytorch_model.bin.index.json".into(),
            ));
        };
        files.push(weights.to_string());
        for f in &files {
            self.fetch_file(id, &repo_dir, &commit, f, progress)?;
        }
        if weights.ends_with(".index.json") {
            for shard in shard_names(&snap.join(weights))? {
                if !has(&shard) {
                    return Err(self.err(id, format!("{weights} names shard {shard}, which the repository does not have")));
                }
                self.fetch_file(id, &repo_dir, &commit, &shard, progress)?;
            }
        }
        self.write_ref(id, &repo_dir, &commit)?;
        Ok(snap)
    }

    /// The snapshot directory of `id` holding `files` (paths inside the repository, such as
    /// `blocks.8.hook_resid_pre/cfg.json`), downloading what is missing; the cache, offline
    /// and unreachable-server rules are those of [`fetch`](Self::fetch).
    pub fn fetch_files(&self, id: &HubId, files: &[String], progress: &mut dyn FnMut(Progress)) -> Result<PathBuf> {
        let repo_dir = self.cache.join(id.cache_name());
        let cached = || -> Result<PathBuf> {
            let snap = repo_dir.join("snapshots").join(self.cached_commit(id, &repo_dir)?);
            match files.iter().find(|f| !snap.join(f).is_file()) {
                Some(f) => Err(self.err(id, format!("cached snapshot {} has no {f}; run without HF_HUB_OFFLINE to download it", snap.display()))),
                None => Ok(snap),
            }
        };
        if self.offline {
            let snap = cached()?;
            progress(Progress::Cached { reason: "HF_HUB_OFFLINE is set".into() });
            return Ok(snap);
        }
        let info = match self.repo_info(id) {
            Ok(info) => info,
            Err(HubFailure::Unreachable(why)) => {
                let snap = cached().map_err(|_| {
                    self.err(id, format!("cannot reach {}: {why}; the files are not in the cache {} either", self.endpoint, self.cache.display()))
                })?;
                progress(Progress::Cached { reason: format!("{} unreachable ({why})", self.endpoint) });
                return Ok(snap);
            }
            Err(HubFailure::Error(e)) => return Err(e),
        };
        if let Some(f) = files.iter().find(|f| !info.siblings.iter().any(|s| &s.rfilename == *f)) {
            return Err(self.err(id, format!("has no file {f}")));
        }
        let snap = repo_dir.join("snapshots").join(&info.sha);
        std::fs::create_dir_all(&snap).map_err(|e| HfError::io(&snap, e))?;
        for f in files {
            self.fetch_file(id, &repo_dir, &info.sha, f, progress)?;
        }
        self.write_ref(id, &repo_dir, &info.sha)?;
        Ok(snap)
    }

    /// The files of `id` (paths inside the repository), as the server lists them; offline or
    /// with the server unreachable, the files of the cached snapshot.
    pub fn list_files(&self, id: &HubId) -> Result<Vec<String>> {
        let repo_dir = self.cache.join(id.cache_name());
        let cached = || -> Result<Vec<String>> {
            let snap = repo_dir.join("snapshots").join(self.cached_commit(id, &repo_dir)?);
            let mut out = Vec::new();
            list_tree(&snap, "", &mut out);
            out.sort();
            Ok(out)
        };
        if self.offline {
            return cached();
        }
        match self.repo_info(id) {
            Ok(info) => Ok(info.siblings.into_iter().map(|s| s.rfilename).collect()),
            Err(HubFailure::Unreachable(why)) => cached().map_err(|_| {
                self.err(id, format!("cannot reach {}: {why}; the repository is not in the cache {} either", self.endpoint, self.cache.display()))
            }),
            Err(HubFailure::Error(e)) => Err(e),
        }
    }

    /// Record which commit a branch or tag pointed to (`refs/<revision>`), as huggingface_hub does.
    fn write_ref(&self, id: &HubId, repo_dir: &Path, commit: &str) -> Result<()> {
        if id.is_commit() {
            return Ok(());
        }
        let r = repo_dir.join("refs").join(&id.revision);
        if let Some(parent) = r.parent() {
            std::fs::create_dir_all(parent).map_err(|e| HfError::io(parent, e))?;
        }
        Ok(crate::files::write_atomic(&r, commit.as_bytes())?)
    }

    /// The commit a cached revision points to.
    fn cached_commit(&self, id: &HubId, repo_dir: &Path) -> Result<String> {
        if id.is_commit() {
            return Ok(id.revision.clone());
        }
        let r = repo_dir.join("refs").join(&id.revision);
        Ok(std::fs::read_to_string(&r)
            .map_err(|_| self.err(id, format!("is not in the cache {} (no {}); run without HF_HUB_OFFLINE to download it", self.cache.display(), r.display())))?
            .trim()
            .to_string())
    }

    fn err(&self, id: &HubId, msg: String) -> HfError {
        HfError::Hub { id: id.to_string(), msg }
    }

    /// The cached snapshot of `id` if it holds a config and complete weights.
    fn cached_snapshot(&self, id: &HubId, repo_dir: &Path) -> Result<PathBuf> {
        let snap = repo_dir.join("snapshots").join(self.cached_commit(id, repo_dir)?);
        if !snap.join("config.json").is_file() {
            return Err(self.err(id, format!("cached snapshot {} has no config.json; run without HF_HUB_OFFLINE to download it", snap.display())));
        }
        let complete = if snap.join("model.safetensors").is_file() || snap.join("pytorch_model.bin").is_file() {
            true
        } else {
            ["model.safetensors.index.json", "pytorch_model.bin.index.json"].iter().any(|i| {
                let p = snap.join(i);
                p.is_file() && shard_names(&p).is_ok_and(|s| s.iter().all(|f| snap.join(f).is_file()))
            })
        };
        if !complete {
            return Err(self.err(id, format!("cached snapshot {} has no complete weights; run without HF_HUB_OFFLINE to download them", snap.display())));
        }
        Ok(snap)
    }

    fn agent(&self, redirects: u32) -> ureq::Agent {
        ureq::Agent::config_builder()
            .http_status_as_error(false)
            .max_redirects(redirects)
            .max_redirects_will_error(false)
            .timeout_connect(Some(Duration::from_secs(20)))
            .timeout_recv_response(Some(Duration::from_secs(60)))
            .timeout_recv_body(Some(Duration::from_secs(60)))
            .build()
            .new_agent()
    }

    fn with_auth<B>(&self, req: ureq::RequestBuilder<B>) -> ureq::RequestBuilder<B> {
        match &self.token {
            Some(t) => req.header("authorization", &format!("Bearer {t}")),
            None => req,
        }
    }

    /// Explain a failed response by its status.
    fn status_error(&self, id: &HubId, what: &str, status: u16) -> HfError {
        let msg = match status {
            401 | 403 if self.token.is_none() => {
                format!("{what}: HTTP {status}: the repository is gated or private; accept its terms on the Hub and set HF_TOKEN")
            }
            401 | 403 => format!("{what}: HTTP {status}: HF_TOKEN is not allowed to read this repository (gated: accept its terms on the Hub)"),
            404 => format!("{what}: HTTP 404: no such repository, revision or file (check the id and the @revision)"),
            s => format!("{what}: HTTP {s}"),
        };
        self.err(id, msg)
    }

    fn repo_info(&self, id: &HubId) -> std::result::Result<RepoInfo, HubFailure> {
        let url = format!("{}/api/{}/{}/revision/{}", self.endpoint, id.kind.plural(), id.repo, url_path(&id.revision));
        let resp = self.with_auth(self.agent(5).get(&url)).call().map_err(|e| HubFailure::Unreachable(e.to_string()))?;
        let status = resp.status().as_u16();
        if status != 200 {
            return Err(HubFailure::Error(self.status_error(id, &format!("GET {url}"), status)));
        }
        let body = resp.into_body().read_to_string().map_err(|e| HubFailure::Unreachable(e.to_string()))?;
        serde_json::from_str(&body).map_err(|e| HubFailure::Error(self.err(id, format!("GET {url}: unexpected answer: {e}"))))
    }

    /// Download one file of `commit` into the blob store and link it into the snapshot.
    fn fetch_file(&self, id: &HubId, repo_dir: &Path, commit: &str, file: &str, progress: &mut dyn FnMut(Progress)) -> Result<()> {
        if file.contains("..") || file.starts_with('/') {
            return Err(self.err(id, format!("refuses the file name {file:?}")));
        }
        let snap_file = repo_dir.join("snapshots").join(commit).join(file);
        if snap_file.is_file() {
            return Ok(());
        }
        // Models resolve at `/{repo}/...`, other repository types under their plural.
        let prefix = match id.kind {
            RepoKind::Model => String::new(),
            kind => format!("{}/", kind.plural()),
        };
        let url = format!("{}/{prefix}{}/resolve/{}/{}", self.endpoint, id.repo, commit, file);
        // What the server says the file is, before any byte is fetched (LFS files answer
        // with a redirect carrying X-Linked-Etag / X-Linked-Size).
        let head = self.with_auth(self.agent(0).head(&url)).call().map_err(|e| self.err(id, format!("HEAD {url}: {e}")))?;
        let status = head.status().as_u16();
        if !(200..400).contains(&status) {
            return Err(self.status_error(id, &format!("HEAD {url}"), status));
        }
        let header = |names: &[&str]| names.iter().find_map(|n| head.headers().get(*n).and_then(|v| v.to_str().ok()).map(|s| s.to_string()));
        let etag = header(&["x-linked-etag", "etag"])
            .map(|e| e.trim_start_matches("W/").trim_matches('"').to_string())
            .filter(|e| !e.is_empty() && e.chars().all(|c| c.is_ascii_alphanumeric() || c == '-'))
            .ok_or_else(|| self.err(id, format!("HEAD {url}: no ETag; cannot verify the download")))?;
        let size: u64 = header(&["x-linked-size", "content-length"])
            .and_then(|s| s.parse().ok())
            .ok_or_else(|| self.err(id, format!("HEAD {url}: no size (X-Linked-Size / Content-Length)")))?;
        let blobs = repo_dir.join("blobs");
        std::fs::create_dir_all(&blobs).map_err(|e| HfError::io(&blobs, e))?;
        let blob = blobs.join(&etag);
        if !blob.is_file() {
            self.download(id, &url, &blob, file, size, &etag, progress)?;
        }
        if let Some(parent) = snap_file.parent() {
            std::fs::create_dir_all(parent).map_err(|e| HfError::io(parent, e))?;
        }
        // Relative link, as huggingface_hub makes it: snapshots/<commit>/<file> -> ../../blobs/<etag>.
        let depth = file.matches('/').count() + 2;
        let target = PathBuf::from("../".repeat(depth)).join("blobs").join(&etag);
        let tmp = snap_file.with_file_name(format!(".{}.link-{}", snap_file.file_name().unwrap_or_default().to_string_lossy(), std::process::id()));
        let _ = std::fs::remove_file(&tmp);
        #[cfg(unix)]
        let linked = std::os::unix::fs::symlink(&target, &tmp);
        #[cfg(not(unix))]
        let linked = std::fs::copy(&blob, &tmp).map(|_| ());
        linked.and_then(|_| std::fs::rename(&tmp, &snap_file)).map_err(|e| HfError::io(&snap_file, e))?;
        progress(Progress::Done { file });
        Ok(())
    }

    /// GET `url` into `blob.incomplete`, resuming what is there, then verify and rename.
    #[allow(clippy::too_many_arguments)]
    fn download(&self, id: &HubId, url: &str, blob: &Path, file: &str, size: u64, etag: &str, progress: &mut dyn FnMut(Progress)) -> Result<()> {
        let partial = blob.with_file_name(format!("{etag}.incomplete"));
        let mut have = std::fs::metadata(&partial).map(|m| m.len()).unwrap_or(0);
        if have > size {
            let _ = std::fs::remove_file(&partial);
            have = 0;
        }
        progress(Progress::Start { file, size, resumed_from: have });
        let mut req = self.with_auth(self.agent(5).get(url));
        if have > 0 {
            req = req.header("range", &format!("bytes={have}-"));
        }
        let resp = req.call().map_err(|e| self.err(id, format!("GET {url}: {e} (the {have} bytes received so far are kept and resumed next time)")))?;
        let status = resp.status().as_u16();
        let append = match status {
            206 => true,
            200 => false, // the server ignored the range: start over
            s => return Err(self.status_error(id, &format!("GET {url}"), s)),
        };
        let mut out =
            std::fs::OpenOptions::new().create(true).write(true).append(append).truncate(!append).open(&partial).map_err(|e| HfError::io(&partial, e))?;
        let mut done = if append { have } else { 0 };
        let mut reader = resp.into_body().into_with_config().limit(size.saturating_sub(done).saturating_add(1)).reader();
        let mut buf = vec![0u8; 1 << 16];
        loop {
            let n = match reader.read(&mut buf) {
                Ok(0) => break,
                Ok(n) => n,
                Err(e) => {
                    let _ = out.flush();
                    return Err(self.err(id, format!("downloading {file}: connection lost after {done} of {size} bytes ({e}); run again to resume")));
                }
            };
            out.write_all(&buf[..n]).map_err(|e| HfError::io(&partial, e))?;
            done += n as u64;
            progress(Progress::Advance { bytes: done });
        }
        out.flush().map_err(|e| HfError::io(&partial, e))?;
        drop(out);
        if done != size {
            if done > size {
                let _ = std::fs::remove_file(&partial);
            }
            return Err(self.err(id, format!("downloading {file}: got {done} bytes, the server announced {size}; run again to resume")));
        }
        if let Err(msg) = verify(&partial, size, etag) {
            let _ = std::fs::remove_file(&partial);
            return Err(self.err(id, format!("downloading {file}: {msg}; the download was deleted")));
        }
        std::fs::rename(&partial, blob).map_err(|e| HfError::io(blob, e))
    }
}

enum HubFailure {
    /// No answer at all (DNS, refused, timeout): the cache may still serve.
    Unreachable(String),
    Error(HfError),
}

/// Percent-encode a revision for a URL path (`refs/pr/1` keeps its slashes encoded).
fn url_path(s: &str) -> String {
    s.bytes().map(|b| if b.is_ascii_alphanumeric() || b"-_.".contains(&b) { (b as char).to_string() } else { format!("%{b:02X}") }).collect()
}

/// Check a downloaded file against the ETag: sha256 of the contents (64 hex digits, LFS) or
/// the git blob sha1 (40 hex digits).
fn verify(path: &Path, size: u64, etag: &str) -> std::result::Result<(), String> {
    let mut f = std::fs::File::open(path).map_err(|e| e.to_string())?;
    let mut buf = vec![0u8; 1 << 16];
    let hex = |b: &[u8]| b.iter().map(|x| format!("{x:02x}")).collect::<String>();
    let (got, kind) = match etag.len() {
        64 => {
            let mut h = sha2::Sha256::new();
            loop {
                let n = f.read(&mut buf).map_err(|e| e.to_string())?;
                if n == 0 {
                    break;
                }
                h.update(&buf[..n]);
            }
            (hex(&h.finalize()), "sha256")
        }
        40 => {
            use sha1::Digest as _;
            let mut h = sha1::Sha1::new();
            h.update(format!("blob {size}\0").as_bytes());
            loop {
                let n = f.read(&mut buf).map_err(|e| e.to_string())?;
                if n == 0 {
                    break;
                }
                h.update(&buf[..n]);
            }
            (hex(&h.finalize()), "git sha1")
        }
        _ => return Ok(()), // an ETag that is not a content hash: the size check is all we have
    };
    if got != etag.to_ascii_lowercase() {
        return Err(format!("{kind} is {got} but the server announced {etag}"));
    }
    Ok(())
}

/// Shard file names listed in a `*.index.json` (`weight_map` values), in first-seen order.
/// The files under `dir` (following the snapshot's links), as `sub/name` paths.
fn list_tree(dir: &Path, prefix: &str, out: &mut Vec<String>) {
    for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let name = format!("{prefix}{}", e.file_name().to_string_lossy());
        match e.path().is_dir() {
            true => list_tree(&e.path(), &format!("{name}/"), out),
            false => out.push(name),
        }
    }
}

fn shard_names(index: &Path) -> Result<Vec<String>> {
    let text = std::fs::read_to_string(index).map_err(|e| HfError::io(index, e))?;
    let v: serde_json::Value = serde_json::from_str(&text).map_err(|e| HfError::Json { path: index.into(), msg: e.to_string() })?;
    let map = v.get("weight_map").and_then(|m| m.as_object()).ok_or_else(|| HfError::Field {
        path: index.into(),
        field: "weight_map".into(),
        msg: "is missing; expected an object of tensor name -> shard file".into(),
    })?;
    let mut out: Vec<String> = Vec::new();
    for f in map.values().filter_map(|v| v.as_str()) {
        if f.contains("..") || f.starts_with('/') {
            return Err(HfError::Field { path: index.into(), field: "weight_map".into(), msg: format!("names the file {f:?} outside the repository") });
        }
        if !out.iter().any(|o| o == f) {
            out.push(f.to_string());
        }
    }
    Ok(out)
}

/// A local model directory, or a Hub id to fetch: `spec` as given to `--model`. An existing
/// path always wins; anything else that looks like `org/name[@revision]` goes to the Hub.
pub fn resolve_model(spec: &str, progress: &mut dyn FnMut(Progress)) -> Result<PathBuf> {
    let path = Path::new(spec);
    if path.exists() {
        return Ok(path.to_path_buf());
    }
    match HubId::parse(spec) {
        Some(id) if !spec.starts_with('.') && !spec.starts_with('/') && !spec.contains('\\') => Hub::from_env().fetch(&id, progress),
        _ => Err(HfError::io(
            path,
            std::io::Error::new(std::io::ErrorKind::NotFound, "no such model directory (and not a Hugging Face Hub id like org/name@revision)"),
        )),
    }
}

/// A folder of a Hub repository, or a local directory: `spec` is a path that exists, or
/// `org/name[@revision][:folder]` (the repository root without `:folder`). `files` are the
/// names the folder must hold; only they are fetched. Returns the local folder.
pub fn resolve_folder(spec: &str, files: &[&str], progress: &mut dyn FnMut(Progress)) -> Result<PathBuf> {
    let path = Path::new(spec);
    if path.exists() {
        return Ok(path.to_path_buf());
    }
    match folder_spec(spec) {
        Some((id, folder)) => {
            let names: Vec<String> = files.iter().map(|f| if folder.is_empty() { f.to_string() } else { format!("{folder}/{f}") }).collect();
            Ok(Hub::from_env().fetch_files(&id, &names, progress)?.join(folder))
        }
        None => Err(HfError::io(
            path,
            std::io::Error::new(std::io::ErrorKind::NotFound, "no such directory (and not a Hugging Face Hub id like org/name@revision:folder)"),
        )),
    }
}

/// `org/name[@revision][:folder]` as the repository and the folder inside it (`""` for the
/// root); `None` for anything that reads as a path or cannot be a Hub id.
pub fn folder_spec(spec: &str) -> Option<(HubId, String)> {
    let (repo, folder) = spec.split_once(':').unwrap_or((spec, ""));
    let folder = folder.trim_matches('/');
    let path_like = spec.starts_with('.') || spec.starts_with('/') || spec.contains('\\') || folder.contains("..");
    HubId::parse(repo).filter(|_| !path_like).map(|id| (id, folder.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hub_ids_parse_and_paths_do_not() {
        assert_eq!(HubId::parse("gpt2"), Some(HubId { repo: "gpt2".into(), revision: "main".into(), kind: RepoKind::Model }));
        let id = HubId::parse("EleutherAI/pythia-70m@step1000").unwrap();
        assert_eq!((id.repo.as_str(), id.revision.as_str(), id.cache_name().as_str()), ("EleutherAI/pythia-70m", "step1000", "models--EleutherAI--pythia-70m"));
        for bad in ["a/b/c", "../x", "a/..", "", "a@", "x y", "org/na me", "/abs/path"] {
            assert_eq!(HubId::parse(bad), None, "{bad}");
        }
    }

    #[test]
    fn git_blob_sha1_and_sha256_etags_are_checked() {
        let dir = std::env::temp_dir().join(format!("burnlens-hub-verify-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let f = dir.join("x");
        std::fs::write(&f, b"hello\n").unwrap();
        // `git hash-object` of "hello\n" and its sha256.
        assert!(verify(&f, 6, "ce013625030ba8dba906f756967f9e9ca394464a").is_ok());
        assert!(verify(&f, 6, "5891b5b522d5df086d0ff0b110fbd9d21bb4fc7163af34d08286a2e846f6be03").is_ok());
        assert!(verify(&f, 6, "0000000000000000000000000000000000000000").unwrap_err().contains("git sha1 is ce0136"));
        let _ = std::fs::remove_dir_all(&dir);
    }
}
