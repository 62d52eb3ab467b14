//! A Hugging Face Hub stand-in on 127.0.0.1 for the download tests: the endpoints
//! `huggingface_hub` and burnlens use (`/api/models/{repo}/revision/{rev}`, `HEAD` and `GET`
//! of `/{repo}/resolve/{commit}/{file}`, LFS files redirected to a CDN path that honours
//! `Range`), serving fixture directories, with switches for the failures the tests need.

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Write};
use std::net::{TcpListener, TcpStream};
use std::path::Path;
use std::sync::{Arc, Mutex};

use sha1::Digest as _;

/// One file as the server holds it.
#[derive(Clone)]
struct File {
    bytes: Vec<u8>,
    /// Served through the LFS path (sha256 ETag, redirect), like weights on the real Hub.
    lfs: bool,
}

#[derive(Clone, Default)]
struct Repo {
    /// branch or tag -> commit
    refs: HashMap<String, String>,
    /// commit -> files
    commits: HashMap<String, HashMap<String, File>>,
    /// Requests must carry `authorization: Bearer <token>`.
    token: Option<String>,
}

/// What the server does wrong, per file name.
#[derive(Default)]
pub struct Faults {
    /// Send only this many bytes of the body the first time the file is fetched, then hang up.
    pub drop_after: HashMap<String, usize>,
    /// Serve these files with one byte flipped (the announced hash stays the original's).
    pub corrupt: Vec<String>,
}

#[derive(Default)]
struct State {
    repos: HashMap<String, Repo>,
    faults: Faults,
    /// Every request line received, with its Range header if any.
    log: Vec<String>,
    /// Files already cut short once.
    dropped: Vec<String>,
    /// sha256 -> bytes for the CDN path.
    cdn: HashMap<String, Vec<u8>>,
}

/// The files under `dir` (subfolders as `sub/name`), without `expected.safetensors`.
fn collect(dir: &Path, prefix: &str, files: &mut HashMap<String, File>) {
    for e in std::fs::read_dir(dir).unwrap().flatten() {
        let name = format!("{prefix}{}", e.file_name().to_string_lossy());
        if e.path().is_dir() {
            collect(&e.path(), &format!("{name}/"), files);
            continue;
        }
        if name.ends_with("expected.safetensors") {
            continue;
        }
        let bytes = std::fs::read(e.path()).unwrap();
        let lfs = name.ends_with(".safetensors") || name.ends_with(".bin");
        files.insert(name, File { bytes, lfs });
    }
}

/// A running server; it stops when the test process ends.
pub struct HubServer {
    pub url: String,
    state: Arc<Mutex<State>>,
}

pub fn sha256_hex(b: &[u8]) -> String {
    sha2::Sha256::digest(b).iter().map(|x| format!("{x:02x}")).collect()
}

fn git_sha1_hex(b: &[u8]) -> String {
    let mut h = sha1::Sha1::new();
    h.update(format!("blob {}\0", b.len()).as_bytes());
    h.update(b);
    h.finalize().iter().map(|x| format!("{x:02x}")).collect()
}

impl HubServer {
    pub fn start() -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind 127.0.0.1");
        let url = format!("http://{}", listener.local_addr().unwrap());
        let state = Arc::new(Mutex::new(State::default()));
        let s = state.clone();
        std::thread::spawn(move || {
            for conn in listener.incoming().flatten() {
                let s = s.clone();
                std::thread::spawn(move || {
                    let _ = serve(conn, &s);
                });
            }
        });
        HubServer { url, state }
    }

    /// Publish the files of `dir` as commit `commit` of `repo`, reachable as `revision`.
    pub fn publish(&self, repo: &str, revision: &str, commit: &str, dir: &Path) {
        let mut files = HashMap::new();
        collect(dir, "", &mut files);
        let mut st = self.state.lock().unwrap();
        for f in files.values().filter(|f| f.lfs) {
            st.cdn.insert(sha256_hex(&f.bytes), f.bytes.clone());
        }
        let r = st.repos.entry(repo.to_string()).or_default();
        r.refs.insert(revision.to_string(), commit.to_string());
        r.commits.insert(commit.to_string(), files);
    }

    /// Require `token` for every request to `repo`.
    pub fn gate(&self, repo: &str, token: &str) {
        self.state.lock().unwrap().repos.get_mut(repo).expect("published").token = Some(token.to_string());
    }

    pub fn set_faults(&self, faults: Faults) {
        self.state.lock().unwrap().faults = faults;
    }

    /// Request lines seen so far.
    pub fn log(&self) -> Vec<String> {
        self.state.lock().unwrap().log.clone()
    }
}

fn respond(conn: &mut TcpStream, status: &str, headers: &[(String, String)], body: &[u8], send_body: bool) -> std::io::Result<()> {
    let mut head = format!("HTTP/1.1 {status}\r\nConnection: close\r\n");
    for (k, v) in headers {
        head.push_str(&format!("{k}: {v}\r\n"));
    }
    if !headers.iter().any(|(k, _)| k.eq_ignore_ascii_case("content-length")) {
        head.push_str(&format!("Content-Length: {}\r\n", body.len()));
    }
    head.push_str("\r\n");
    conn.write_all(head.as_bytes())?;
    if send_body {
        conn.write_all(body)?;
    }
    conn.flush()
}

fn serve(mut conn: TcpStream, state: &Arc<Mutex<State>>) -> std::io::Result<()> {
    let mut reader = BufReader::new(conn.try_clone()?);
    let mut line = String::new();
    reader.read_line(&mut line)?;
    let mut parts = line.split_whitespace();
    let (method, path) = (parts.next().unwrap_or("").to_string(), parts.next().unwrap_or("").to_string());
    let mut headers = HashMap::new();
    loop {
        let mut h = String::new();
        if reader.read_line(&mut h)? == 0 || h == "\r\n" {
            break;
        }
        if let Some((k, v)) = h.split_once(':') {
            headers.insert(k.trim().to_ascii_lowercase(), v.trim().to_string());
        }
    }
    let range = headers.get("range").cloned();
    state.lock().unwrap().log.push(format!("{method} {path}{}", range.as_ref().map(|r| format!(" [{r}]")).unwrap_or_default()));
    let head_only = method == "HEAD";
    let not_found =
        |conn: &mut TcpStream| respond(conn, "404 Not Found", &[("X-Error-Code".into(), "RepoNotFound".into())], b"{\"error\":\"not found\"}", !head_only);

    // CDN: /cdn/<sha256>, with Range.
    if let Some(sha) = path.strip_prefix("/cdn/") {
        let (bytes, name) = {
            let st = state.lock().unwrap();
            let Some(b) = st.cdn.get(sha).cloned() else { return not_found(&mut conn) };
            let name = st
                .repos
                .values()
                .flat_map(|r| r.commits.values())
                .flat_map(|c| c.iter())
                .find(|(_, f)| sha256_hex(&f.bytes) == sha)
                .map(|(n, _)| n.clone())
                .unwrap_or_default();
            (b, name)
        };
        let mut body = bytes;
        if state.lock().unwrap().faults.corrupt.contains(&name) {
            let mid = body.len() / 2;
            body[mid] ^= 0x5a;
        }
        let start =
            range.as_deref().and_then(|r| r.strip_prefix("bytes=")).and_then(|r| r.trim_end_matches('-').parse::<usize>().ok()).unwrap_or(0).min(body.len());
        let total = body.len();
        let part = &body[start..];
        let (status, mut h) = if start > 0 {
            ("206 Partial Content", vec![("Content-Range".to_string(), format!("bytes {start}-{}/{total}", total - 1))])
        } else {
            ("200 OK", vec![])
        };
        h.push(("Content-Length".into(), part.len().to_string()));
        let cut = {
            let mut st = state.lock().unwrap();
            match st.faults.drop_after.get(&name).copied() {
                Some(n) if !st.dropped.contains(&name) => {
                    st.dropped.push(name.clone());
                    Some(n)
                }
                _ => None,
            }
        };
        if let Some(n) = cut {
            // Announce everything, send a part, hang up.
            respond(&mut conn, status, &h, &part[..n.min(part.len())], true)?;
            return conn.shutdown(std::net::Shutdown::Both);
        }
        return respond(&mut conn, status, &h, part, !head_only);
    }

    // API: /api/models/<repo>/revision/<rev>, and /api/datasets/<repo>/... for the repos
    // published as `datasets/<repo>` (whose files resolve under `/datasets/<repo>/`).
    let api = path.strip_prefix("/api/models/").map(str::to_string).or_else(|| path.strip_prefix("/api/datasets/").map(|r| format!("datasets/{r}")));
    if let Some(rest) = api {
        let Some((repo, rev)) = rest.split_once("/revision/") else { return not_found(&mut conn) };
        let rev = rev.replace("%2F", "/");
        let st = state.lock().unwrap();
        let Some(r) = st.repos.get(repo) else { return not_found(&mut conn) };
        if let Some(t) = &r.token
            && headers.get("authorization") != Some(&format!("Bearer {t}"))
        {
            return respond(&mut conn, "401 Unauthorized", &[], b"{\"error\":\"gated\"}", true);
        }
        let commit = r.refs.get(&rev).cloned().or_else(|| r.commits.contains_key(&rev).then(|| rev.clone()));
        let Some(commit) = commit else { return not_found(&mut conn) };
        let mut names: Vec<&String> = r.commits[&commit].keys().collect();
        names.sort();
        let siblings: Vec<String> = names.iter().map(|n| format!("{{\"rfilename\":\"{n}\"}}")).collect();
        let body = format!("{{\"id\":\"{repo}\",\"sha\":\"{commit}\",\"siblings\":[{}]}}", siblings.join(","));
        return respond(&mut conn, "200 OK", &[("Content-Type".into(), "application/json".into())], body.as_bytes(), true);
    }

    // Files: /<repo>/resolve/<commit>/<file>
    let Some((repo, rest)) = path.trim_start_matches('/').split_once("/resolve/") else { return not_found(&mut conn) };
    let Some((commit, file)) = rest.split_once('/') else { return not_found(&mut conn) };
    let st = state.lock().unwrap();
    let Some(r) = st.repos.get(repo) else { return not_found(&mut conn) };
    if let Some(t) = &r.token
        && headers.get("authorization") != Some(&format!("Bearer {t}"))
    {
        return respond(&mut conn, "401 Unauthorized", &[], b"", !head_only);
    }
    let Some(f) = r.commits.get(commit).and_then(|c| c.get(file)).cloned() else { return not_found(&mut conn) };
    drop(st);
    if f.lfs {
        let sha = sha256_hex(&f.bytes);
        let h = vec![
            ("Location".to_string(), format!("/cdn/{sha}")),
            ("X-Repo-Commit".to_string(), commit.to_string()),
            ("X-Linked-Etag".to_string(), format!("\"{sha}\"")),
            ("X-Linked-Size".to_string(), f.bytes.len().to_string()),
            ("ETag".to_string(), format!("\"{}\"", git_sha1_hex(b"pointer"))),
        ];
        return respond(&mut conn, "302 Found", &h, b"", false);
    }
    let mut body = f.bytes.clone();
    if state.lock().unwrap().faults.corrupt.iter().any(|c| c == file) {
        body[0] ^= 0x20;
    }
    let h = vec![("X-Repo-Commit".to_string(), commit.to_string()), ("ETag".to_string(), format!("\"{}\"", git_sha1_hex(&f.bytes)))];
    respond(&mut conn, "200 OK", &h, &body, !head_only)
}
