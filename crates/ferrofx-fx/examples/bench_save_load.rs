//! Save/load benchmark of a traced ResNet-50 (issue 7, acceptance 4): `GraphModule::save` and
//! `GraphModule::load` against raw file write/read of the same number of bytes (the disk bound)
//! and, when a Python with torch and torchvision is given, against `torch.save`/`torch.load` of
//! the same weights (`scripts/bench/save_load_torch.py`).
//!
//! ```text
//! cargo run --release -p ferrofx-fx --example bench_save_load -- --reference .venv/bin/python
//! ```
//!
//! Options: `--repeat R` (best of R, default 5), `--dir DIR` (where the files go; default the
//! system temporary directory), `--reference PYTHON`, `--script PATH`.
//! Every time is wall-clock; files are in the page cache after the first write on both sides,
//! so "disk" here means the file system path the operating system gives both programs.

use ferrofx_core::ops::random::manual_seed;
use ferrofx_fx::{symbolic_trace, GraphModule};
use ferrofx_nn::zoo::ResNet;
use ferrofx_nn::Module;
use std::collections::HashMap;
use std::hint::black_box;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

struct Options {
    repeat: usize,
    dir: PathBuf,
    reference: Option<String>,
    script: String,
}

fn parse_args() -> Result<Options, String> {
    let mut o = Options {
        repeat: 5,
        dir: std::env::temp_dir(),
        reference: None,
        script: concat!(env!("CARGO_MANIFEST_DIR"), "/../../scripts/bench/save_load_torch.py").to_string(),
    };
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        let mut value = || args.next().ok_or_else(|| format!("{a} needs a value"));
        match a.as_str() {
            "--repeat" => o.repeat = value()?.parse().map_err(|e| format!("--repeat: {e}"))?,
            "--dir" => o.dir = PathBuf::from(value()?),
            "--reference" => o.reference = Some(value()?),
            "--script" => o.script = value()?,
            "--bench" => {}
            "-h" | "--help" => {
                return Err(
                    "usage: bench_save_load [--repeat R] [--dir DIR] [--reference PYTHON] [--script PATH]".into()
                )
            }
            other => return Err(format!("unknown argument {other}")),
        }
    }
    if o.repeat == 0 {
        return Err("--repeat must be at least 1".into());
    }
    Ok(o)
}

/// (first, best) wall time of `n` runs of `f`, in seconds. The first run of a fresh process
/// pays the page faults of memory the allocator has not handed out before; later runs reuse it.
fn best<T>(n: usize, mut f: impl FnMut() -> T) -> (f64, f64) {
    let times: Vec<f64> = (0..n)
        .map(|_| {
            let t = Instant::now();
            black_box(f());
            t.elapsed().as_secs_f64()
        })
        .collect();
    (times[0], times.iter().copied().fold(f64::INFINITY, f64::min))
}

fn write_raw(path: &Path, bytes: &[u8]) {
    let mut f = std::fs::File::create(path).expect("create raw file");
    f.write_all(bytes).expect("write raw file");
}

/// Runs the PyTorch script; returns its `name value` lines.
fn reference(python: &str, script: &str, dir: &Path, repeat: usize) -> Result<HashMap<String, f64>, String> {
    let out = Command::new(python)
        .arg(script)
        .arg("--repeat")
        .arg(repeat.to_string())
        .arg("--dir")
        .arg(dir)
        .output()
        .map_err(|e| format!("cannot run {python}: {e}"))?;
    if !out.status.success() {
        return Err(format!("{script} failed: {}", String::from_utf8_lossy(&out.stderr)));
    }
    let mut m = HashMap::new();
    for line in String::from_utf8_lossy(&out.stdout).lines() {
        let mut it = line.split_whitespace();
        if let (Some(k), Some(v)) = (it.next(), it.next()) {
            if let Ok(v) = v.parse::<f64>() {
                m.insert(k.to_string(), v);
            }
        }
    }
    Ok(m)
}

fn main() {
    let o = match parse_args() {
        Ok(o) => o,
        Err(e) => {
            eprintln!("{e}");
            std::process::exit(2);
        }
    };
    manual_seed(0);
    let mut model = ResNet::resnet50(1000).expect("resnet50");
    model.eval();
    let gm = symbolic_trace(&model).expect("trace resnet50");
    let params: usize = model.named_parameters().iter().map(|(_, t)| t.numel()).sum::<usize>()
        + model.named_buffers().iter().map(|(_, t)| t.numel()).sum::<usize>();
    let file = o.dir.join("ferrofx_bench_resnet50.fxm");
    let raw = o.dir.join("ferrofx_bench_raw.bin");

    let save = best(o.repeat, || gm.save(&file).expect("save"));
    let size = std::fs::metadata(&file).expect("saved file").len() as f64;
    // the loaded module runs and equals the saved one
    let loaded = GraphModule::load(&file).expect("load");
    let x = ferrofx_core::ops::random::randn(&[1, 3, 64, 64], None).expect("input");
    let (a, b) = {
        let _g = ferrofx_core::autograd::no_grad();
        (gm.forward(&x).expect("forward"), loaded.forward(&x).expect("forward of the loaded module"))
    };
    assert_eq!(a.to_vec::<f32>().expect("f32"), b.to_vec::<f32>().expect("f32"), "loaded module differs");
    let load = best(o.repeat, || GraphModule::load(&file).expect("load"));
    let bytes = vec![1u8; size as usize];
    let raw_write = best(o.repeat, || write_raw(&raw, &bytes));
    let raw_read = best(o.repeat, || std::fs::read(&raw).expect("read raw"));
    let _ = std::fs::remove_file(&raw);

    let mb = size / 1e6;
    println!("ResNet-50 traced module: {params} tensor elements, file {mb:.1} MB, best of {}", o.repeat);
    println!("first = first call in the process (fresh memory); best = best of the {} calls", o.repeat);
    println!("| operation | ferrofx first / best (ms) | MB/s (best) | raw file I/O, same bytes, first / best (ms) | torch first / best (ms) | ratio first / best |");
    println!("| --- | ---: | ---: | ---: | ---: | ---: |");
    let torch = match &o.reference {
        Some(py) => match reference(py, &o.script, &o.dir, o.repeat) {
            Ok(m) => Some(m),
            Err(e) => {
                eprintln!("reference failed: {e}");
                None
            }
        },
        None => None,
    };
    for (name, ours, raw_t) in [("save", save, raw_write), ("load", load, raw_read)] {
        let reference =
            torch.as_ref().and_then(|m| Some((*m.get(&format!("{name}_first_ms"))?, *m.get(&format!("{name}_ms"))?)));
        let (t, ratio) = match reference {
            Some((tf, tb)) => {
                (format!("{tf:.1} / {tb:.1}"), format!("{:.2}× / {:.2}×", tf / (ours.0 * 1e3), tb / (ours.1 * 1e3)))
            }
            None => ("—".to_string(), "no reference".to_string()),
        };
        println!(
            "| {name} | {:.1} / {:.1} | {:.0} | {:.1} / {:.1} | {t} | {ratio} |",
            ours.0 * 1e3,
            ours.1 * 1e3,
            mb / ours.1,
            raw_t.0 * 1e3,
            raw_t.1 * 1e3
        );
    }
    if let Some(m) = &torch {
        if let Some(sz) = m.get("file_mb") {
            println!("torch.save file: {sz:.1} MB");
        }
    }
    let _ = std::fs::remove_file(&file);
}
