//! The reference side of the bench: `scripts/bench_reference.py --serve` (PyTorch, and ONNX
//! Runtime for the whole-model cases) kept running beside the bench and asked to time one case
//! at a time, so the two sides of a row are measured back to back (and, with `--rounds N`,
//! alternately N times: each side's figure is its best median over the rounds). A machine whose
//! speed drifts over minutes then moves both columns of a row alike, which running all of
//! ferrofx's cases first and all of the reference's afterwards did not.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};

/// What the reference measured: PyTorch per case id, and ONNX Runtime for the whole-model
/// inference cases (a time, or why it did not run); the best over the rounds asked.
pub struct Reference {
    pub torch: BTreeMap<String, f64>,
    pub torch_version: String,
    pub ort: BTreeMap<String, Result<f64, String>>,
    pub ort_version: Option<String>,
    /// ONNX Runtime's peak RSS growth (bytes) where the script measured it (issue 18's rows).
    pub ort_peak: BTreeMap<String, f64>,
}

/// The running reference script.
pub struct Server {
    child: Child,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
    /// Where the script's stderr goes (its tail is quoted when it fails).
    log: PathBuf,
    /// What it measured so far.
    pub found: Reference,
}

impl Server {
    /// Starts `python scripts/bench_reference.py --serve` (its stderr to `log`) and reads the
    /// PyTorch version it announces, returning once the script says it is ready.
    pub fn start(python: &Path, quick: bool, log: PathBuf) -> Result<Server, String> {
        if !python.exists() {
            return Err(format!("{} not found (run with --setup-reference)", python.display()));
        }
        if let Some(dir) = log.parent() {
            let _ = std::fs::create_dir_all(dir);
        }
        let err = std::fs::File::create(&log).map_err(|e| format!("cannot create {}: {e}", log.display()))?;
        let mut cmd = Command::new(python);
        cmd.arg("scripts/bench_reference.py").arg("--serve");
        if quick {
            cmd.arg("--quick");
        }
        let mut child = cmd
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(err)
            .spawn()
            .map_err(|e| format!("cannot run {}: {e}", python.display()))?;
        let (Some(stdin), Some(stdout)) = (child.stdin.take(), child.stdout.take()) else {
            return Err("the reference script's pipes were not opened".into());
        };
        let mut s = Server {
            child,
            stdin,
            stdout: BufReader::new(stdout),
            log,
            found: Reference {
                torch: BTreeMap::new(),
                torch_version: "?".into(),
                ort: BTreeMap::new(),
                ort_version: None,
                ort_peak: BTreeMap::new(),
            },
        };
        // the version first, then "ready" once the script has imported everything and built
        // its tables (about 2 s of both cores): nothing is timed before, so ferrofx's first
        // case (and a case timed alone in a fresh process) never shares the machine with it
        loop {
            let v = s.line()?;
            if let Some(ver) = v.get("torch_version").and_then(|v| v.as_str()) {
                s.found.torch_version = ver.to_string();
            }
            if v.get("ready").is_some() {
                return Ok(s);
            }
        }
    }

    /// The next JSON line of the script's answers.
    fn line(&mut self) -> Result<serde_json::Value, String> {
        loop {
            let mut l = String::new();
            let n = self.stdout.read_line(&mut l).map_err(|e| e.to_string())?;
            if n == 0 {
                let _ = self.child.wait();
                let tail = std::fs::read_to_string(&self.log).unwrap_or_default();
                let tail: String =
                    tail.lines().rev().take(15).collect::<Vec<_>>().into_iter().rev().collect::<Vec<_>>().join("\n");
                return Err(format!("reference script ended: {tail}"));
            }
            if let Ok(v) = serde_json::from_str::<serde_json::Value>(&l) {
                return Ok(v);
            }
        }
    }

    /// Times case `id` on the reference once more, keeping each engine's best time.
    pub fn time(&mut self, id: &str) -> Result<(), String> {
        writeln!(self.stdin, "{id}").and_then(|_| self.stdin.flush()).map_err(|e| e.to_string())?;
        loop {
            let v = self.line()?;
            let text = |k: &str| v.get(k).and_then(|x| x.as_str()).map(str::to_string);
            if v.get("done").is_some() {
                return Ok(());
            }
            let (Some(id), seconds) = (text("id"), v.get("seconds").and_then(|x| x.as_f64())) else { continue };
            let r = &mut self.found;
            if text("engine").as_deref() == Some("onnxruntime") {
                if let Some(ver) = text("version") {
                    r.ort_version = Some(ver);
                }
                if let Some(p) = v.get("peak_bytes").and_then(|x| x.as_f64()) {
                    r.ort_peak.insert(id.clone(), p);
                }
                let new = seconds.ok_or_else(|| text("error").unwrap_or_else(|| "no time reported".into()));
                let best = match (r.ort.remove(&id), new) {
                    (Some(Ok(a)), Ok(b)) => Ok(a.min(b)),
                    (Some(Ok(a)), Err(_)) => Ok(a),
                    (_, b) => b,
                };
                r.ort.insert(id, best);
            } else if let Some(s) = seconds {
                let e = r.torch.entry(id).or_insert(s);
                *e = e.min(s);
            }
        }
    }

    /// Stops the script and returns what it measured.
    pub fn finish(mut self) -> Reference {
        drop(self.stdin);
        let _ = self.child.wait();
        self.found
    }
}
