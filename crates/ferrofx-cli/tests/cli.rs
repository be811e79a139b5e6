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
        .args(["train", "--quiet", "--epochs", "1", "--out"])
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
        .stdout(predicate::str::contains("parameters       38378"));
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
