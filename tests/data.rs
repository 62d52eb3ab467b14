//! Corpora: the rows of text, jsonl and parquet files (and folders of shards, and Hub
//! datasets from a server on 127.0.0.1) cut into the windows SAELens 6 cuts
//! (`tests/fixtures/data/windows.json`, written by `scripts/gen_data_fixtures.py` with
//! SAELens's own `concat_and_batch_sequences`), and one-line errors for bad files.

mod common;

use std::path::{Path, PathBuf};

use burnlens::data::{Column, DataError, DatasetSpec, Rows, Separator, WindowConfig, WindowStream, Windows};
use burnlens::hf::Tokenizer;
use burnlens::hf::hub::Hub;
use common::hub_server::HubServer;
use serde_json::Value;

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/data")
}

fn gpt2_tokenizer() -> Option<Tokenizer> {
    let data = common::shared_data()?;
    Some(Tokenizer::from_file(&data.join("gpt2/tokenizer.json")).unwrap())
}

fn cases() -> (u32, Vec<Value>) {
    let v: Value = serde_json::from_str(&std::fs::read_to_string(fixtures().join("windows.json")).unwrap()).unwrap();
    (v["bos"].as_u64().unwrap() as u32, v["cases"].as_array().unwrap().clone())
}

fn config(case: &Value, bos: u32) -> WindowConfig {
    WindowConfig {
        context_size: case["context_size"].as_u64().unwrap() as usize,
        prepend_bos: case["prepend_bos"].as_bool().unwrap(),
        separator: match case["separator"].as_u64() {
            Some(t) if t as u32 == bos => Separator::Bos,
            Some(t) => Separator::Token(t as u32),
            None => Separator::None,
        },
        disable_concat: case["disable_concat"].as_bool().unwrap(),
    }
}

fn expected(case: &Value) -> Vec<Vec<u32>> {
    serde_json::from_value(case["windows"].clone()).unwrap()
}

fn windows(files: Vec<PathBuf>, tok: Option<&Tokenizer>, bos: u32, cfg: &WindowConfig) -> Result<Vec<Vec<u32>>, DataError> {
    Windows::new(Rows::new(files, Column::default()), tok, Some(bos), cfg)?.collect()
}

#[test]
fn text_jsonl_and_parquet_give_saelens_windows() {
    let Some(tok) = gpt2_tokenizer() else { return };
    let (bos, cases) = cases();
    for file in ["corpus.txt", "corpus.jsonl", "corpus.parquet"] {
        for case in &cases {
            let got = windows(vec![fixtures().join(file)], Some(&tok), bos, &config(case, bos)).unwrap();
            assert_eq!(got, expected(case), "{file}, case {}", case["name"]);
        }
    }
}

#[test]
fn pretokenized_rows_are_cut_to_the_context() {
    let (bos, cases) = cases();
    let mut it = Windows::new(Rows::new(vec![fixtures().join("tokens.parquet")], Column::default()), None, Some(bos), &config(&cases[0], bos)).unwrap();
    assert!(it.pretokenized);
    let got: Vec<Vec<u32>> = it.by_ref().collect::<Result<_, _>>().unwrap();
    assert_eq!(got, expected(&cases[0]));
    // Asking for more context than the rows hold is refused, naming the file.
    let mut long = config(&cases[0], bos);
    long.context_size += 2;
    let err = windows(vec![fixtures().join("tokens.parquet")], None, bos, &long).unwrap_err().to_string();
    assert!(err.contains("tokens.parquet") && err.contains("fewer than context_size"), "{err}");
}

/// The corpus's jsonl rows split into shards `data/{split}-0000{i}-of-0000{n}.jsonl`.
/// After every window `k` of a stream, a fresh stream that seeks to the position the first
/// reported gives the same windows from there to the end.
fn assert_seeking_equals_reading(make: &dyn Fn() -> Windows<'static>, what: &str) {
    let all: Vec<Vec<u32>> = make().collect::<Result<_, _>>().unwrap();
    assert!(all.len() > 3, "{what}: a corpus of a few windows at least");
    let mut reading = make();
    for k in 0..=all.len() {
        let at = reading.cursor();
        assert_eq!(at.windows, k as u64);
        let mut seeking = make();
        seeking.seek(&at).unwrap();
        assert_eq!(seeking.cursor(), at, "{what}: the position after seeking");
        let rest: Vec<Vec<u32>> = seeking.collect::<Result<_, _>>().unwrap();
        assert_eq!(rest, all[k..], "{what}: the windows after seeking to window {k}");
        reading.next();
    }
    let mut started = make();
    started.next();
    assert!(started.seek(&reading.cursor()).unwrap_err().to_string().contains("from its start only"));
}

#[test]
fn seeking_to_a_saved_position_gives_the_windows_that_follow_it() {
    let (bos, cases) = cases();
    let tokens = fixtures().join("tokens.parquet");
    let cfg = config(&cases[0], bos);
    assert_seeking_equals_reading(&|| Windows::new(Rows::new(vec![tokens.clone()], Column::default()), None, Some(bos), &cfg).unwrap(), "pretokenized");
    // A corpus shorter than the position is an error, not an empty stream.
    let mut short = Windows::new(Rows::new(vec![tokens.clone()], Column::default()), None, Some(bos), &cfg).unwrap();
    let far = burnlens::data::WindowPosition { windows: 1_000_000, rows: 1_000_000, offset: 0, row_start: true };
    assert!(short.seek(&far).unwrap_err().to_string().contains("ends before the position"));
    let tok: &'static Tokenizer = Box::leak(Box::new(gpt2_tokenizer().expect("the shared GPT-2 tokenizer")));
    for case in &cases {
        let cfg = config(case, bos);
        let file = fixtures().join("corpus.jsonl");
        assert_seeking_equals_reading(
            &|| Windows::new(Rows::new(vec![file.clone()], Column::default()), Some(tok), Some(bos), &cfg).unwrap(),
            &format!("text, case {}", case["name"]),
        );
    }
}

fn write_shards(dir: &Path) {
    let text = std::fs::read_to_string(fixtures().join("corpus.jsonl")).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    let half = lines.len() / 2;
    std::fs::create_dir_all(dir.join("data")).unwrap();
    std::fs::write(dir.join("data/train-00000-of-00002.jsonl"), lines[..half].join("\n")).unwrap();
    std::fs::write(dir.join("data/train-00001-of-00002.jsonl"), lines[half..].join("\n")).unwrap();
    std::fs::write(dir.join("data/test-00000-of-00001.jsonl"), "{\"text\": \"held out\"}\n").unwrap();
    std::fs::write(dir.join("README.md"), "# a dataset card, not data\n").unwrap();
}

#[test]
fn a_folder_of_shards_reads_in_order_and_a_split_selects_its_files() {
    let Some(tok) = gpt2_tokenizer() else { return };
    let (bos, cases) = cases();
    let dir = tempfile::tempdir().unwrap();
    write_shards(dir.path());
    let files = burnlens::data::shard_files(dir.path(), Some("train")).unwrap();
    assert_eq!(files.len(), 2);
    assert_eq!(windows(files, Some(&tok), bos, &config(&cases[0], bos)).unwrap(), expected(&cases[0]));
    assert_eq!(burnlens::data::shard_files(dir.path(), None).unwrap().len(), 3);
}

#[test]
fn a_hub_dataset_is_fetched_into_the_cache_and_read_offline_after() {
    let Some(tok) = gpt2_tokenizer() else { return };
    let (bos, cases) = cases();
    let repo = tempfile::tempdir().unwrap();
    write_shards(repo.path());
    let server = HubServer::start();
    server.publish("datasets/lens/corpus", "main", &"c".repeat(40), repo.path());
    let cache = tempfile::tempdir().unwrap();
    let hub = Hub { endpoint: server.url.clone(), cache: cache.path().to_path_buf(), token: None, offline: false };
    let spec = DatasetSpec::parse("lens/corpus:train").unwrap();
    let files = spec.files(&hub, &mut |_| {}).unwrap();
    assert!(files.iter().all(|f| f.starts_with(cache.path().join("datasets--lens--corpus/snapshots"))), "{files:?}");
    assert_eq!(files.len(), 2, "only the train split is fetched: {files:?}");
    assert!(server.log().iter().all(|l| !l.contains("test-00000")), "the test split was fetched: {:?}", server.log());
    assert_eq!(windows(files.clone(), Some(&tok), bos, &config(&cases[0], bos)).unwrap(), expected(&cases[0]));
    // Offline, from the cache alone.
    let offline = Hub { offline: true, endpoint: "http://127.0.0.1:9".into(), ..hub };
    assert_eq!(spec.files(&offline, &mut |_| {}).unwrap(), files);
    let missing = DatasetSpec::parse("lens/other").unwrap().files(&offline, &mut |_| {}).unwrap_err().to_string();
    assert!(missing.contains("lens/other") && missing.contains("not in the cache"), "{missing}");
}

#[test]
fn bad_files_are_one_line_errors_naming_file_and_column() {
    let (bos, cases) = cases();
    let cfg = config(&cases[0], bos);
    let rows = |f: &Path, c: Option<&str>| Rows::new(vec![f.to_path_buf()], Column(c.map(str::to_string)));
    let dir = tempfile::tempdir().unwrap();
    let mut errors = Vec::new();
    // A column that is not there.
    let err = Windows::new(rows(&fixtures().join("corpus.parquet"), Some("body")), None, Some(bos), &cfg).err().unwrap().to_string();
    assert!(err.contains("corpus.parquet") && err.contains("`body`") && err.contains("id, text"), "{err}");
    errors.push(err);
    // A parquet file cut short.
    let bytes = std::fs::read(fixtures().join("corpus.parquet")).unwrap();
    let cut = dir.path().join("cut.parquet");
    std::fs::write(&cut, &bytes[..bytes.len() / 2]).unwrap();
    let err = Windows::new(rows(&cut, None), None, Some(bos), &cfg).err().unwrap().to_string();
    assert!(err.starts_with(&cut.display().to_string()) && err.contains("parquet"), "{err}");
    errors.push(err);
    // A jsonl line that is not JSON, after a good one.
    let bad = dir.path().join("bad.jsonl");
    std::fs::write(&bad, "{\"text\": \"fine\"}\n{oops\n").unwrap();
    let err = rows(&bad, None).collect::<Result<Vec<_>, _>>().unwrap_err().to_string();
    assert!(err.contains("bad.jsonl") && err.contains("line 2") && err.contains("not valid JSON"), "{err}");
    errors.push(err);
    // Text without a tokenizer.
    let err = windows(vec![fixtures().join("corpus.txt")], None, bos, &cfg).unwrap_err().to_string();
    assert!(err.contains("corpus.txt") && err.contains("no tokenizer"), "{err}");
    errors.push(err);
    for e in errors {
        assert!(!e.contains('\n'), "one line: {e}");
    }
}
