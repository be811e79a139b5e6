//! Tokenisation for BERT-style sentence models: a `tokenizer.json` (Hugging Face's fast
//! tokenizer format, read with the `tokenizers` crate), truncated at the model's maximum
//! sequence length and padded to the longest sentence of each batch, as
//! `sentence-transformers` calls it (`padding=True, truncation="longest_first"`).

use ferrofx_core::{Error, Result, Tensor};
use std::path::Path;
use tokenizers::{PaddingStrategy, Tokenizer, TruncationParams, TruncationStrategy};

/// Token ids and attention mask of a batch, both `[N, L]` int64 (`L` = the longest sentence
/// of the batch after truncation, at least 2 for `[CLS]` and `[SEP]`).
#[derive(Debug, Clone)]
pub struct TokenBatch {
    /// `input_ids` `[N, L]`, padded with the pad id.
    pub input_ids: Tensor,
    /// `attention_mask` `[N, L]`: 1 on tokens, 0 on padding.
    pub attention_mask: Tensor,
}

/// A BERT tokenizer read from `tokenizer.json`, with truncation at `max_length` and padding to
/// the longest sentence of a batch.
#[derive(Clone)]
pub struct BertTokenizer {
    inner: Tokenizer,
    max_length: usize,
}

impl std::fmt::Debug for BertTokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BertTokenizer").field("max_length", &self.max_length).finish_non_exhaustive()
    }
}

impl BertTokenizer {
    /// Reads `path` (a `tokenizer.json`) and truncates every sentence to `max_length` tokens
    /// (special tokens included).
    pub fn from_file(path: &Path, max_length: usize) -> Result<BertTokenizer> {
        let bytes = std::fs::read(path).map_err(|e| {
            Error::io(
                "BertTokenizer",
                format!("cannot read {}: {e}; fix: pass a model folder that has it", path.display()),
            )
        })?;
        Self::from_bytes(&bytes, max_length)
            .map_err(|e| Error::io("BertTokenizer", format!("{}: {}", path.display(), e.message())))
    }

    /// Parses the bytes of a `tokenizer.json`.
    pub fn from_bytes(bytes: &[u8], max_length: usize) -> Result<BertTokenizer> {
        if max_length < 2 {
            return Err(Error::argument(
                "BertTokenizer",
                format!("max_length {max_length} leaves no room for [CLS] and [SEP]"),
            ));
        }
        let corrupt = |e: String| {
            Error::io(
                "BertTokenizer",
                format!("not a valid tokenizer.json ({e}); fix: restore the file from the model's package"),
            )
        };
        let mut inner = Tokenizer::from_bytes(bytes).map_err(|e| corrupt(e.to_string()))?;
        inner
            .with_truncation(Some(TruncationParams {
                max_length,
                strategy: TruncationStrategy::LongestFirst,
                ..TruncationParams::default()
            }))
            .map_err(|e| corrupt(e.to_string()))?;
        let mut padding = inner.get_padding().cloned().unwrap_or_default();
        padding.strategy = PaddingStrategy::BatchLongest;
        padding.pad_to_multiple_of = None;
        inner.with_padding(Some(padding));
        Ok(BertTokenizer { inner, max_length })
    }

    /// The truncation length.
    pub fn max_length(&self) -> usize {
        self.max_length
    }

    /// The vocabulary size including added tokens (every id is below it).
    pub fn vocab_size(&self) -> usize {
        self.inner.get_vocab_size(true)
    }

    /// Tokenises a batch: surrounding whitespace is stripped (as `sentence-transformers` does),
    /// `[CLS] ... [SEP]` added, truncated, padded to the batch's longest.
    pub fn encode_batch(&self, sentences: &[&str]) -> Result<TokenBatch> {
        if sentences.is_empty() {
            return Err(Error::argument("BertTokenizer", "encode_batch needs at least one sentence"));
        }
        let inputs: Vec<&str> = sentences.iter().map(|s| s.trim()).collect();
        let encodings = self
            .inner
            .encode_batch(inputs, true)
            .map_err(|e| Error::argument("BertTokenizer", format!("cannot tokenise the batch: {e}")))?;
        let n = encodings.len();
        let l = encodings.iter().map(|e| e.get_ids().len()).max().unwrap_or(0);
        let mut ids = Vec::with_capacity(n * l);
        let mut mask = Vec::with_capacity(n * l);
        for e in &encodings {
            if e.get_ids().len() != l {
                return Err(Error::argument("BertTokenizer", "the tokenizer did not pad the batch to one length"));
            }
            ids.extend(e.get_ids().iter().map(|&i| i as i64));
            mask.extend(e.get_attention_mask().iter().map(|&m| m as i64));
        }
        Ok(TokenBatch { input_ids: Tensor::from_vec(ids, &[n, l])?, attention_mask: Tensor::from_vec(mask, &[n, l])? })
    }
}
