//! Integration tests of the `ferrofx` binary: every subcommand, with one bad-input case each.

use assert_cmd::Command;
use predicates::prelude::*;

fn ferrofx() -> Command {
    Command::cargo_bin("ferrofx").expect("the ferrofx binary is built")
}

#[test]
fn help_lists_the_subcommands() {
    ferrofx()
        .arg("--help")
        .assert()
        .success()
        .stdout(predicate::str::contains("demo").and(predicate::str::contains("train")));
}

#[test]
fn demo_trains_saves_reloads_and_reports() {
    let dir = tempfile::tempdir().expect("temp dir");
    let out = ferrofx().args(["demo", "--quiet", "--out-dir"]).arg(dir.path()).assert().success();
    let text = String::from_utf8_lossy(&out.get_output().stdout).to_string();
    let pct = |label: &str| -> f64 {
        text.lines()
            .find(|l| l.contains(label))
            .and_then(|l| l.split_whitespace().last())
            .and_then(|v| v.trim_end_matches('%').parse().ok())
            .unwrap_or_else(|| panic!("no '{label}' line in:\n{text}"))
    };
    for label in ["test accuracy (trained)", "test accuracy (optimised)", "test accuracy (reloaded)"] {
        assert!(pct(label) >= 97.0, "{label}: {}", pct(label));
    }
    assert_eq!(pct("reloaded = optimised"), 100.0);
    assert!(pct("optimised = eager predictions") >= 99.0);
    assert!(text.contains("2 BatchNorm folded, 1 dropout removed"), "{text}");
    assert!(text.contains("call_module[target=conv1]"), "the traced graph is printed: {text}");
    assert!(dir.path().join("digits_cnn.fxm").exists());
    // the memory-budget section (issue 21, acceptance 4): the budget halves what is saved for
    // backward and lowers the peak activation memory
    let less = |label: &str| -> f64 {
        let line = text.lines().find(|l| l.contains(label)).unwrap_or_else(|| panic!("no '{label}' line:\n{text}"));
        line.split('(').nth(1).and_then(|v| v.split('%').next()).and_then(|v| v.parse().ok()).unwrap()
    };
    assert!(text.contains("memory budget 0.5"), "{text}");
    assert!(less("saved for backward") >= 50.0, "{text}");
    assert!(less("peak activation memory") > 0.0, "{text}");
    // the int8 section (issue 20, acceptance 2): accuracy within 0.5 pp, file >= 70% smaller
    let line = text.lines().find(|l| l.contains("% int8 (")).unwrap_or_else(|| panic!("no int8 line:\n{text}"));
    let pcts: Vec<f64> =
        line.split_whitespace().filter_map(|w| w.strip_suffix('%').and_then(|v| v.parse().ok())).collect();
    assert!(pcts.len() >= 2 && (pcts[0] - pcts[1]).abs() <= 0.5, "{line}");
    let line = text.lines().find(|l| l.contains("bytes int8")).unwrap_or_else(|| panic!("no size line:\n{text}"));
    let smaller: f64 = line.split('(').nth(1).and_then(|v| v.split('%').next()).and_then(|v| v.parse().ok()).unwrap();
    assert!(smaller >= 70.0, "{line}");
    assert!(dir.path().join("digits_cnn.int8.fxm").exists());

    // ferrofx quantize on the saved float module, calibrated on a .npy file
    let calib = dir.path().join("calib.npy");
    let header = "{'descr': '<f4', 'fortran_order': False, 'shape': (40, 1, 8, 8), }";
    let mut header = header.to_string();
    while !(10 + header.len() + 1).is_multiple_of(64) {
        header.push(' ');
    }
    header.push('\n');
    let mut bytes = b"\x93NUMPY\x01\x00".to_vec();
    bytes.extend_from_slice(&(header.len() as u16).to_le_bytes());
    bytes.extend_from_slice(header.as_bytes());
    for i in 0..40 * 64 {
        bytes.extend_from_slice(&(((i * 37) % 17) as f32).to_le_bytes());
    }
    std::fs::write(&calib, bytes).unwrap();
    let out8 = dir.path().join("cli.int8.fxm");
    ferrofx()
        .arg("quantize")
        .arg(dir.path().join("digits_cnn.fxm"))
        .arg("--calibrate")
        .arg(&calib)
        .arg("-o")
        .arg(&out8)
        .assert()
        .success()
        .stdout(predicate::str::contains("4 int8 ops"));
    ferrofx()
        .args(["show"])
        .arg(&out8)
        .assert()
        .success()
        .stdout(predicate::str::contains("quantized_conv2d").and(predicate::str::contains("quantize_per_tensor")));
    ferrofx()
        .arg("quantize")
        .arg(dir.path().join("digits_cnn.fxm"))
        .arg("--calibrate")
        .arg(dir.path().join("missing.npy"))
        .arg("-o")
        .arg(&out8)
        .assert()
        .failure()
        .stderr(predicate::str::contains("missing.npy"));
}

#[test]
fn train_writes_a_state_dict() {
    let dir = tempfile::tempdir().expect("temp dir");
    let file = dir.path().join("w.safetensors");
    ferrofx()
        .args(["train", "--quiet", "--epochs", "1", "--out"])
        .arg(&file)
        .assert()
        .success()
        .stdout(predicate::str::contains("state dict written to"));
    let bytes = std::fs::read(&file).expect("state dict file");
    assert!(bytes.len() > 1000);
}

#[test]
fn train_rejects_bad_arguments() {
    ferrofx()
        .args(["train", "--quiet", "--epochs", "0"])
        .assert()
        .failure()
        .stderr(predicate::str::contains("--epochs must be at least 1"));
    ferrofx()
        .args(["train", "--quiet", "--test-fraction", "1.5"])
        .assert()
        .failure()
        .stderr(predicate::str::contains("--test-fraction must be in (0, 1), got 1.5"));
}

#[test]
fn train_reports_an_unwritable_output() {
    let dir = tempfile::tempdir().expect("temp dir");
    let file = dir.path().join("no/such/dir/w.safetensors");
    ferrofx()
        .args(["train", "--quiet", "--epochs", "1", "-o"])
        .arg(&file)
        .assert()
        .failure()
        .stderr(predicate::str::contains("does not exist; create it first").and(predicate::str::contains("mkdir -p")))
        // refused before training: no epoch ran
        .stdout(predicate::str::contains("trained").not());
}

#[test]
fn unknown_subcommand_fails_with_usage() {
    ferrofx().arg("frobnicate").assert().failure().stderr(predicate::str::contains("unrecognized subcommand"));
}

/// A traced module file made by `convert` from a fresh state dict written by `train`.
fn fixture(dir: &std::path::Path) -> std::path::PathBuf {
    let weights = dir.join("w.safetensors");
    ferrofx().args(["train", "--quiet", "--epochs", "1", "--out"]).arg(&weights).assert().success();
    let file = dir.join("m.fxm");
    ferrofx()
        .args(["convert", "--model", "digits-cnn", "--weights"])
        .arg(&weights)
        .arg("--out")
        .arg(&file)
        .assert()
        .success()
        .stdout(predicate::str::contains("nodes, traced from DigitsCnn"));
    file
}

#[test]
fn convert_show_run_bench_draw_on_a_traced_module() {
    let dir = tempfile::tempdir().expect("temp dir");
    let file = fixture(dir.path());
    ferrofx().arg("show").arg(&file).assert().success().stdout(predicate::str::contains("call_module[target=conv1]"));
    ferrofx().arg("show").arg(&file).args(["--view", "tabular"]).assert().success().stdout(
        predicate::str::contains("call_module")
            .and(predicate::str::contains("[1, 16, 8, 8]"))
            .and(predicate::str::contains("FLOPs")),
    );
    ferrofx()
        .arg("show")
        .arg(&file)
        .args(["--view", "flops"])
        .assert()
        .success()
        .stdout(predicate::str::contains("(all)").and(predicate::str::contains("conv1")));
    ferrofx()
        .arg("show")
        .arg(&file)
        .args(["--view", "code"])
        .assert()
        .success()
        .stdout(predicate::str::contains("drop("));
    ferrofx()
        .arg("show")
        .arg(&file)
        .args(["--view", "summary"])
        .assert()
        .success()
        .stdout(predicate::str::contains("parameters       38330"));
    // run: inputs from safetensors, outputs to safetensors
    let mut sd = ferrofx_nn::StateDict::new();
    sd.insert("input0".into(), ferrofx_core::Tensor::from_vec(vec![0.5f32; 2 * 64], &[2, 1, 8, 8]).unwrap());
    let inp = dir.path().join("in.safetensors");
    ferrofx_nn::save_state_dict(&sd, &inp).unwrap();
    let out = dir.path().join("out.safetensors");
    ferrofx().arg("run").arg(&file).arg("--input").arg(&inp).arg("--out").arg(&out).assert().success();
    let o = ferrofx_nn::load_state_dict_file(&out).unwrap();
    assert_eq!(o["output0"].shape(), &[2, 10]);
    // run: inputs from .npy files NumPy wrote, output to .npy; equal to the safetensors path
    let digits = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/digits2.npy");
    let out_npy = dir.path().join("out.npy");
    ferrofx()
        .arg("run")
        .arg(&file)
        .arg("-i")
        .arg(&digits)
        .arg("-o")
        .arg(&out_npy)
        .assert()
        .success()
        .stdout(predicate::str::contains("wrote 1 output"));
    let out_st = dir.path().join("digits.safetensors");
    ferrofx().arg("run").arg(&file).arg("-i").arg(&digits).arg("-o").arg(&out_st).assert().success();
    let npy_bytes = std::fs::read(&out_npy).unwrap();
    let header_end = 10 + u16::from_le_bytes([npy_bytes[8], npy_bytes[9]]) as usize;
    let header = String::from_utf8_lossy(&npy_bytes[10..header_end]).to_string();
    assert!(header.contains("'descr': '<f4'") && header.contains("'shape': (2, 10)"), "{header}");
    let want: Vec<u8> = ferrofx_nn::load_state_dict_file(&out_st).unwrap()["output0"]
        .to_vec::<f32>()
        .unwrap()
        .into_iter()
        .flat_map(f32::to_le_bytes)
        .collect();
    assert_eq!(&npy_bytes[header_end..], &want[..]);
    ferrofx()
        .arg("bench")
        .arg(&file)
        .args(["--shape", "4,1,8,8", "--runs", "5"])
        .assert()
        .success()
        .stdout(predicate::str::contains("median latency").and(predicate::str::contains("samples/s at batch 4")));
    for ext in ["dot", "svg"] {
        let d = dir.path().join(format!("g.{ext}"));
        ferrofx().arg("draw").arg(&file).arg("-o").arg(&d).assert().success();
        let text = std::fs::read_to_string(&d).unwrap();
        assert!(text.contains("conv1"), "{ext}: {text}");
    }
}

#[test]
fn show_exprs_prints_the_expression_view() {
    let dir = tempfile::tempdir().expect("temp dir");
    let file = fixture(dir.path());
    let expected = || {
        // after the inputs/outputs header every view starts with
        predicate::str::starts_with(format!("{}: traced from DigitsCnn\ninputs:\n", file.display()))
            .and(predicate::str::contains("\n\nDigitsCnn.Graph (self, x) {\n"))
            .and(predicate::str::contains("\t%2:\tconv1_1 = getattr(self, \"conv1\") -> (Conv2d)\n"))
            .and(predicate::str::contains("\t%3:\tconv1 = conv1_1(x, )\n"))
            .and(predicate::str::contains("\treturn "))
    };
    ferrofx().arg("show").arg("--exprs").arg(&file).assert().success().stdout(expected());
    ferrofx().arg("show").arg(&file).args(["--view", "exprs"]).assert().success().stdout(expected());
    ferrofx()
        .arg("show")
        .arg("--exprs")
        .arg(dir.path().join("missing.fxm"))
        .assert()
        .failure()
        .stderr(predicate::str::contains("cannot load"));
}

#[test]
fn file_commands_reject_bad_input_with_clear_messages() {
    let dir = tempfile::tempdir().expect("temp dir");
    let junk = dir.path().join("junk.fxm");
    std::fs::write(&junk, b"not a model").unwrap();
    for cmd in ["show", "draw", "bench", "run"] {
        let mut c = ferrofx();
        c.arg(cmd).arg(&junk);
        match cmd {
            "draw" => {
                c.arg("-o").arg(dir.path().join("x.svg"));
            }
            "bench" => {
                c.args(["--shape", "1,1,8,8"]);
            }
            "run" => {
                c.arg("--input").arg(&junk).arg("--out").arg(dir.path().join("o.safetensors"));
            }
            _ => {}
        }
        c.assert()
            .failure()
            .stderr(predicate::str::contains("cannot load").and(predicate::str::contains("truncated or corrupt")));
    }
    let file = fixture(dir.path());
    ferrofx()
        .arg("draw")
        .arg(&file)
        .arg("-o")
        .arg(dir.path().join("g.png"))
        .assert()
        .failure()
        .stderr(predicate::str::contains("use .dot or .svg"));
    ferrofx()
        .arg("bench")
        .arg(&file)
        .args(["--shape", "0,1"])
        .assert()
        .failure()
        .stderr(predicate::str::contains("--shape [0, 1] must be"));
    // a state dict of the wrong architecture
    let w = dir.path().join("w.safetensors");
    ferrofx()
        .args(["convert", "--model", "resnet18", "--weights"])
        .arg(&w)
        .arg("-o")
        .arg(dir.path().join("r.fxm"))
        .assert()
        .failure()
        .stderr(
            predicate::str::contains("the weights do not fit Resnet18").and(predicate::str::contains("Missing key(s)")),
        );
    // run with inputs of the wrong shape names the node
    let mut sd = ferrofx_nn::StateDict::new();
    sd.insert("input0".into(), ferrofx_core::Tensor::from_vec(vec![0.5f32; 64], &[1, 64]).unwrap());
    let inp = dir.path().join("in.safetensors");
    ferrofx_nn::save_state_dict(&sd, &inp).unwrap();
    ferrofx()
        .arg("run")
        .arg(&file)
        .arg("--input")
        .arg(&inp)
        .arg("-o")
        .arg(dir.path().join("o.safetensors"))
        .assert()
        .failure()
        .stderr(predicate::str::contains("while running node 'conv1'"));
    // .npy inputs: a damaged file names itself; npy and safetensors inputs do not mix
    let bad = dir.path().join("bad.npy");
    std::fs::write(&bad, b"\x93NUMPY\x01\x00\xff\xff{'descr'").unwrap();
    ferrofx()
        .arg("run")
        .arg(&file)
        .arg("-i")
        .arg(&bad)
        .arg("-o")
        .arg(dir.path().join("o.npy"))
        .assert()
        .failure()
        .stderr(predicate::str::contains("bad.npy: truncated: the header declares 65535 bytes"));
    ferrofx()
        .arg("run")
        .arg(&file)
        .arg("-i")
        .arg(&bad)
        .arg("-i")
        .arg(&inp)
        .arg("-o")
        .arg(dir.path().join("o.npy"))
        .assert()
        .failure()
        .stderr(predicate::str::contains("give either one safetensors file or .npy files"));
}

/// A `.npy` file of float64 values (NumPy's default dtype), shape `[1, 1, 8, 8]`.
fn float64_npy(path: &std::path::Path) {
    let mut header = String::from("{'descr': '<f8', 'fortran_order': False, 'shape': (1, 1, 8, 8), }");
    let unpadded = 10 + header.len() + 1;
    header.push_str(&" ".repeat(unpadded.next_multiple_of(64) - unpadded));
    header.push('\n');
    let mut bytes = b"\x93NUMPY\x01\x00".to_vec();
    bytes.extend_from_slice(&(header.len() as u16).to_le_bytes());
    bytes.extend_from_slice(header.as_bytes());
    for i in 0..64 {
        bytes.extend_from_slice(&((i % 16) as f64 / 16.0).to_le_bytes());
    }
    std::fs::write(path, bytes).unwrap();
}

/// The messages a newcomer meets: what a file expects, what a run returned, dtype conversion,
/// outputs that would destroy inputs, bad learning rates, paths that cannot be written, and a
/// run whose memory would exceed the limit.
#[test]
fn newcomer_messages() {
    let dir = tempfile::tempdir().expect("temp dir");
    // train writes the weights and a runnable traced module next to them
    let weights = dir.path().join("w.safetensors");
    ferrofx()
        .args(["train", "--quiet", "--epochs", "1", "--out"])
        .arg(&weights)
        .assert()
        .success()
        .stdout(predicate::str::contains("runnable traced module to"));
    let file = dir.path().join("w.fxm");
    assert!(file.exists() && weights.exists());
    // show starts with the inputs and outputs
    ferrofx().arg("show").arg(&file).assert().success().stdout(
        predicate::str::contains("inputs:\n  x                [1, 1, 8, 8] float32")
            .and(predicate::str::contains("outputs:\n"))
            .and(predicate::str::contains("[1, 10] float32")),
    );
    // run: float64 input converted with a note; a summary with the top classes; --print values
    let x = dir.path().join("x.npy");
    float64_npy(&x);
    ferrofx()
        .arg("run")
        .arg(&file)
        .arg("-i")
        .arg(&x)
        .arg("--print")
        .assert()
        .success()
        .stderr(predicate::str::contains("is float64; converted to float32, the dtype the module expects"))
        .stdout(
            predicate::str::contains("output0: shape [1, 10], float32")
                .and(predicate::str::contains("sample 0: class "))
                .and(predicate::str::contains("%)"))
                .and(predicate::str::contains("tensor(")),
        );
    // an output path equal to an input is refused, and the input survives
    let before = std::fs::read(&file).unwrap();
    ferrofx().arg("run").arg(&file).arg("-i").arg(&x).arg("-o").arg(&file).assert().failure().stderr(
        predicate::str::contains("refusing to write the output to").and(predicate::str::contains("also an input")),
    );
    assert_eq!(std::fs::read(&file).unwrap(), before);
    ferrofx()
        .arg("run")
        .arg(&file)
        .arg("-i")
        .arg(&x)
        .arg("-o")
        .arg(&x)
        .assert()
        .failure()
        .stderr(predicate::str::contains("also an input"));
    // learning rates
    ferrofx().args(["train", "--quiet", "--lr", "-1"]).assert().failure().stderr(
        predicate::str::contains("--lr must be a positive number such as 0.01, got -1")
            .and(predicate::str::contains("tip").not()),
    );
    ferrofx()
        .args(["train", "--quiet", "--lr", "1e30"])
        .assert()
        .failure()
        .stderr(predicate::str::contains("is far too large for Adam").and(predicate::str::contains("NaN")));
    // a plan over the memory limit is refused before it runs, naming node, shape and limit
    ferrofx()
        .arg("bench")
        .arg(&file)
        .args(["--shape", "65536,1,8,8", "--max-memory", "64M", "--runs", "1"])
        .assert()
        .failure()
        .stderr(
            predicate::str::contains("node 'conv1'")
                .and(predicate::str::contains("[65536, 16, 8, 8]"))
                .and(predicate::str::contains("memory limit of 64.0 MiB"))
                .and(predicate::str::contains("--max-memory")),
        );
    ferrofx()
        .arg("run")
        .arg(&file)
        .arg("-i")
        .arg(&x)
        .args(["--max-memory", "lots"])
        .assert()
        .failure()
        .stderr(predicate::str::contains("'lots' is not a memory size"));
    // loader errors say what is wrong and what to do
    ferrofx()
        .arg("show")
        .arg(dir.path())
        .assert()
        .failure()
        .stderr(predicate::str::contains("is a directory").and(predicate::str::contains("hint:")));
    ferrofx().arg("show").arg(&weights).assert().failure().stderr(
        predicate::str::contains("not a ferrofx traced-module file")
            .and(predicate::str::contains("plain state dict"))
            .and(predicate::str::contains("io error").not()),
    );
    // a .npy header NumPy would reject
    let dup = dir.path().join("dup.npy");
    let mut b = std::fs::read(&x).unwrap();
    let at = b.windows(24).position(|w| w == b"'fortran_order': False, ").unwrap();
    b[at..at + 24].copy_from_slice(b"'descr': '<f8',         ");
    std::fs::write(&dup, b).unwrap();
    ferrofx()
        .arg("run")
        .arg(&file)
        .arg("-i")
        .arg(&dup)
        .assert()
        .failure()
        .stderr(predicate::str::contains("dup.npy: the header dict has the key 'descr' twice"));
}

/// A safetensors file's header (JSON) edited by `f`, its data unchanged.
fn edit_header(bytes: &[u8], f: impl FnOnce(&mut serde_json::Value)) -> Vec<u8> {
    let n = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    let mut header: serde_json::Value = serde_json::from_slice(&bytes[8..8 + n]).unwrap();
    f(&mut header);
    let text = header.to_string();
    let mut out = (text.len() as u64).to_le_bytes().to_vec();
    out.extend_from_slice(text.as_bytes());
    out.extend_from_slice(&bytes[8 + n..]);
    out
}

/// A traced-module file's module document edited by `f`.
fn edit_document(bytes: &[u8], f: impl FnOnce(&mut serde_json::Value)) -> Vec<u8> {
    edit_header(bytes, |h| {
        let meta = &mut h["__metadata__"];
        let mut doc: serde_json::Value = serde_json::from_str(meta["ferrofx.module"].as_str().unwrap()).unwrap();
        f(&mut doc);
        meta["ferrofx.module"] = doc.to_string().into();
    })
}

/// `ferrofx show` on bytes written to `dir/name`: fails, and stderr has every piece of `want`.
fn show_fails_with(dir: &std::path::Path, name: &str, bytes: &[u8], want: &[&str]) {
    let p = dir.join(name);
    std::fs::write(&p, bytes).unwrap();
    let out = ferrofx().arg("show").arg(&p).assert().failure();
    let err = String::from_utf8_lossy(&out.get_output().stderr).to_string();
    for w in want {
        assert!(err.contains(w), "{name}: «{w}» not in:\n{err}");
    }
    assert!(err.contains(&format!("cannot load {}", p.display())) && err.contains("hint:"), "{name}: {err}");
}

/// Every loader message of issue 17 as the CLI prints it: one per error kind (I/O, format,
/// version, limit), offset errors naming the tensor, undeclared inputs, an unknown op, and a
/// file listing 1.2 million undeclared tensors refused quickly and in bounded memory.
#[test]
fn loader_errors_by_kind_reach_the_user() {
    let dir = tempfile::tempdir().expect("temp dir");
    let file = fixture(dir.path());
    let good = std::fs::read(&file).unwrap();
    // I/O: a missing file, a directory
    ferrofx()
        .arg("show")
        .arg(dir.path().join("missing.fxm"))
        .assert()
        .failure()
        .stderr(predicate::str::contains("cannot read").and(predicate::str::contains("check the path")));
    ferrofx()
        .arg("show")
        .arg(dir.path())
        .assert()
        .failure()
        .stderr(predicate::str::contains("it is a directory, not a file"));
    // version: written by a newer ferrofx
    let newer = edit_header(&good, |h| h["__metadata__"]["ferrofx.version"] = "99".into());
    show_fails_with(
        dir.path(),
        "newer.fxm",
        &newer,
        &["format version 99, but this ferrofx reads versions up to 1", "upgrade ferrofx"],
    );
    // format: an op this program does not have; a declared input the graph lacks
    let unknown = edit_document(&good, |d| d["graph"]["nodes"][1]["target"] = "os_system".into());
    let unknown = edit_document(&unknown, |d| d["graph"]["nodes"][1]["op"] = "call_function".into());
    show_fails_with(dir.path(), "unknown_op.fxm", &unknown, &["calls the op 'os_system', which is not registered"]);
    let inputs = edit_document(&good, |d| d["inputs"] = serde_json::json!(["x", "labels"]));
    show_fails_with(
        dir.path(),
        "inputs.fxm",
        &inputs,
        &["declares the input 'labels', but its graph has no placeholder for it"],
    );
    // limit: over a bound of the format
    let rank = edit_document(&good, |d| d["tensors"][0]["shape"] = serde_json::json!(vec![1; 100]));
    show_fails_with(
        dir.path(),
        "rank.fxm",
        &rank,
        &["exceeds a limit of the format", "has rank 100 > 64", "over a bound of the format"],
    );
    // offsets: the tensor at fault is named, whichever check fails
    let mut first = String::new();
    let short = edit_header(&good, |h| {
        let (name, entry) = h
            .as_object_mut()
            .unwrap()
            .iter_mut()
            .find(|(k, v)| *k != "__metadata__" && v["data_offsets"][0] == 0)
            .unwrap();
        first = name.clone();
        let end = entry["data_offsets"][1].as_u64().unwrap();
        entry["data_offsets"][1] = (end - 4).into();
    });
    show_fails_with(
        dir.path(),
        "offsets.fxm",
        &short,
        &[&format!("tensor '{first}' is "), "but its data_offsets [0, ", "span"],
    );
    let past = edit_header(&good, |h| {
        let obj = h.as_object_mut().unwrap();
        let last = obj
            .iter_mut()
            .filter(|(k, _)| *k != "__metadata__")
            .max_by_key(|(_, v)| v["data_offsets"][1].as_u64().unwrap())
            .unwrap();
        first = last.0.clone();
        let (s, e) = (last.1["data_offsets"][0].as_u64().unwrap(), last.1["data_offsets"][1].as_u64().unwrap());
        last.1["data_offsets"] = serde_json::json!([s + 4, e + 4]);
    });
    show_fails_with(dir.path(), "past.fxm", &past, &[&format!("tensor '{first}' has data_offsets"), "past the end"]);
    // 1.2 million undeclared one-byte tensors (an 84 MB header): refused before any tensor is
    // read, in seconds and bounded memory
    let doc = r#"{"producer":"x","type_name":"T","training":false,"graph":{"nodes":[{"name":"x","op":"placeholder","target":"x"},{"name":"output","op":"output","target":"output","args":[{"node":0}]}]}}"#;
    let meta =
        serde_json::json!({"ferrofx.format": "ferrofx.traced_module", "ferrofx.version": "1", "ferrofx.module": doc});
    let n = 1_200_000usize;
    let mut text = format!("{{\"__metadata__\":{meta}");
    for i in 0..n {
        text.push_str(&format!(",\"t{i}\":{{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[{i},{}]}}", i + 1));
    }
    text.push('}');
    let mut bytes = (text.len() as u64).to_le_bytes().to_vec();
    bytes.extend_from_slice(text.as_bytes());
    bytes.resize(bytes.len() + n, 0);
    let many = dir.path().join("many.fxm");
    std::fs::write(&many, &bytes).unwrap();
    let t = std::time::Instant::now();
    let mut child = std::process::Command::new(assert_cmd::cargo::cargo_bin("ferrofx"))
        .arg("show")
        .arg(&many)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    // the child's peak resident memory, sampled until it exits (Linux)
    let mut peak_kb = 0u64;
    let status = loop {
        if let Ok(s) = std::fs::read_to_string(format!("/proc/{}/status", child.id())) {
            if let Some(kb) = s.lines().find(|l| l.starts_with("VmHWM:")).and_then(|l| l.split_whitespace().nth(1)) {
                peak_kb = peak_kb.max(kb.parse().unwrap_or(0));
            }
        }
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        std::thread::sleep(std::time::Duration::from_millis(5));
    };
    let elapsed = t.elapsed();
    let mut err = String::new();
    std::io::Read::read_to_string(child.stderr.as_mut().unwrap(), &mut err).unwrap();
    assert!(!status.success());
    assert!(err.contains("the file holds 1200000 tensors but declares 0; undeclared tensors are not allowed"), "{err}");
    assert!(elapsed.as_secs() < 60, "refused after {elapsed:?}");
    // a small multiple of the 86 MB file (the header's entries parsed once)
    assert!(peak_kb < 1 << 20, "peak RSS {} MiB", peak_kb >> 10);
    eprintln!("1.2M undeclared tensors: refused in {elapsed:?}, peak RSS {} MiB", peak_kb >> 10);
}

/// `.npy` inputs NumPy would not have written are refused, each with its own message.
#[test]
fn malformed_npy_headers_are_refused() {
    let dir = tempfile::tempdir().expect("temp dir");
    let file = fixture(dir.path());
    let good = std::fs::read(std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/digits2.npy")).unwrap();
    let header_len = u16::from_le_bytes([good[8], good[9]]) as usize;
    let header = String::from_utf8(good[10..10 + header_len].to_vec()).unwrap();
    // the same header text, edited, padded back to its length
    let with_header = |h: &str| {
        let mut b = good[..10].to_vec();
        let mut h = h.trim_end().to_string();
        h.truncate(header_len - 1);
        while h.len() < header_len - 1 {
            h.push(' ');
        }
        h.push('\n');
        b.extend_from_slice(h.as_bytes());
        b.extend_from_slice(&good[10 + header_len..]);
        b
    };
    let cases: Vec<(&str, Vec<u8>, &str)> = vec![
        ("magic", b"PK\x03\x04 not numpy at all".to_vec(), "not a .npy file"),
        ("version", [&good[..6], &[9u8, 0], &good[8..]].concat(), "unsupported .npy format version 9.0"),
        (
            "missing key",
            with_header(&header.replace("'fortran_order': False, ", "")),
            "the header has no 'fortran_order' entry",
        ),
        (
            "unknown key",
            with_header(&header.replace("'fortran_order'", "'fortran_ordr'")),
            "the unexpected key 'fortran_ordr'",
        ),
        ("bad shape", with_header(&header.replace("(2, 1, 8, 8)", "(2, x, 8, 8)")), "the shape has a bad dimension"),
        ("shape vs data", with_header(&header.replace("(2, 1, 8, 8)", "(3, 1, 8, 8)")), "needs"),
        ("big endian", with_header(&header.replace("'<f4'", "'>f4'")), "big-endian data ('>f4') is not supported"),
        ("text after the dict", with_header(&header.replace("}", "} junk")), "text after its dict"),
        (
            "duplicate key",
            with_header(&header.replace("'fortran_order': False", "'descr': '<f4'")),
            "has the key 'descr' twice",
        ),
    ];
    assert!(header.contains("(2, 1, 8, 8)") && header.contains("'<f4'"), "{header}");
    for (name, bytes, want) in cases {
        let p = dir.path().join(format!("{}.npy", name.replace(' ', "_")));
        std::fs::write(&p, bytes).unwrap();
        ferrofx()
            .arg("run")
            .arg(&file)
            .arg("-i")
            .arg(&p)
            .assert()
            .failure()
            .stderr(predicate::str::contains(p.display().to_string()).and(predicate::str::contains(want)));
    }
}

/// The compute limit on the command line: a run refused before it starts names the node, its
/// FLOPs and the limit; a bad `--max-flops` value is explained.
#[test]
fn max_flops_refuses_before_running() {
    let dir = tempfile::tempdir().expect("temp dir");
    let file = fixture(dir.path());
    ferrofx()
        .arg("bench")
        .arg(&file)
        .args(["--shape", "64,1,8,8", "--max-flops", "1M", "--runs", "1"])
        .assert()
        .failure()
        .stderr(
            predicate::str::contains("over the compute limit of 1000000 FLOPs")
                .and(predicate::str::contains("node '"))
                .and(predicate::str::contains("--max-flops")),
        );
    ferrofx()
        .arg("bench")
        .arg(&file)
        .args(["--shape", "1,1,8,8", "--max-flops", "lots"])
        .assert()
        .failure()
        .stderr(predicate::str::contains("'lots' is not a FLOP count"));
    ferrofx()
        .arg("bench")
        .arg(&file)
        .args(["--shape", "18446744073709551615,2"])
        .assert()
        .failure()
        .stderr(predicate::str::contains("must be non-empty positive sizes of at most 2^28 elements"));
}
