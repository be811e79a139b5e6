//! Group `qkernels` (issue 20, int8 kernels): every distinct convolution of ResNet-18 and
//! ResNet-50 (224 px) and their final linear layers, at batch 1 and 8, as ferrofx's
//! `quantized_conv2d` / `quantized_linear` (case `qconv_...`) and as ferrofx's float conv /
//! linear of the same shape (case `..._f32`). The reference script
//! (`scripts/quant/bench_qconv.py`, run by `scripts/bench_reference.py`) times PyTorch's
//! `torch.ops.quantized.conv2d` / `linear` (fbgemm, pre-packed weights, channels-last input as
//! in a converted model) for the int8 ids and `F.conv2d` / `F.linear` for the `_f32` ids.
//!
//! Under the table, [`summary`] prints one line per shape (ours int8, PyTorch int8, ours f32,
//! and the ratios) and the sums over each network's layers (with their multiplicities).

use crate::cases::{data, Case, Runner};
use ferrofx_core::ops::quantized::{quantized_conv2d, quantized_linear, quantized_linear_dynamic, QuantizedConv2dArgs};
use ferrofx_core::{op, Result, Tensor, Value};
use std::collections::BTreeMap;

/// A layer shape: `(in channels, out channels, kernel, stride, input size)`; `kernel == 0`
/// marks a linear layer `in -> out`. Padding is `kernel / 2`.
type Shape = (usize, usize, usize, usize, usize);

/// The distinct layers, with how often ResNet-18 and ResNet-50 use each.
const SHAPES: &[(Shape, usize, usize)] = &[
    ((3, 64, 7, 2, 224), 1, 1),
    ((64, 64, 3, 1, 56), 4, 3),
    ((64, 128, 3, 2, 56), 1, 0),
    ((128, 128, 3, 1, 28), 3, 3),
    ((64, 128, 1, 2, 56), 1, 0),
    ((128, 256, 3, 2, 28), 1, 0),
    ((256, 256, 3, 1, 14), 3, 5),
    ((128, 256, 1, 2, 28), 1, 0),
    ((256, 512, 3, 2, 14), 1, 0),
    ((512, 512, 3, 1, 7), 3, 2),
    ((256, 512, 1, 2, 14), 1, 0),
    ((64, 64, 1, 1, 56), 0, 1),
    ((64, 256, 1, 1, 56), 0, 4),
    ((256, 64, 1, 1, 56), 0, 2),
    ((256, 128, 1, 1, 56), 0, 1),
    ((128, 128, 3, 2, 56), 0, 1),
    ((128, 512, 1, 1, 28), 0, 4),
    ((256, 512, 1, 2, 56), 0, 1),
    ((512, 128, 1, 1, 28), 0, 3),
    ((512, 256, 1, 1, 28), 0, 1),
    ((256, 256, 3, 2, 28), 0, 1),
    ((256, 1024, 1, 1, 14), 0, 6),
    ((512, 1024, 1, 2, 28), 0, 1),
    ((1024, 256, 1, 1, 14), 0, 5),
    ((1024, 512, 1, 1, 14), 0, 1),
    ((512, 512, 3, 2, 14), 0, 1),
    ((512, 2048, 1, 1, 7), 0, 3),
    ((1024, 2048, 1, 2, 14), 0, 1),
    ((2048, 512, 1, 1, 7), 0, 2),
    ((512, 1000, 0, 0, 0), 1, 0),
    ((2048, 1000, 0, 0, 0), 0, 1),
];

const BATCHES: [usize; 2] = [1, 8];

/// The case id of layer `s` at `batch` (`_f32` appended for the float case).
fn id(s: Shape, batch: usize, float: bool) -> String {
    let (ci, co, k, st, hw) = s;
    let base =
        if k == 0 { format!("qlinear_{ci}x{co}_b{batch}") } else { format!("qconv_{ci}x{co}_k{k}s{st}_{hw}_b{batch}") };
    if float {
        format!("{base}_f32")
    } else {
        base
    }
}

/// Output spatial size of a conv layer.
fn out_size(s: Shape) -> usize {
    let (_, _, k, st, hw) = s;
    (hw + 2 * (k / 2) - k) / st + 1
}

/// Multiply-adds of layer `s` at `batch`.
fn macs(s: Shape, batch: usize) -> f64 {
    let (ci, co, k, _, _) = s;
    if k == 0 {
        (batch * ci * co) as f64
    } else {
        let o = out_size(s);
        (batch * co * o * o * ci * k * k) as f64
    }
}

/// Deterministic bytes.
fn bytes(n: usize, seed: u64) -> Vec<u8> {
    data(n, seed).into_iter().map(|v| ((v + 1.0) * 127.5) as u8).collect()
}

fn setup(index: usize) -> Result<Runner> {
    let (s, batch, float) = (CASES[index / 2].0, CASES[index / 2].1, index % 2 == 1);
    let (ci, co, k, st, hw) = s;
    let bias = Tensor::from_vec(data(co, 5), &[co])?;
    if float {
        let _g = ferrofx_core::autograd::no_grad();
        let (x, w) = if k == 0 {
            (Tensor::from_vec(data(batch * ci, 1), &[batch, ci])?, Tensor::from_vec(data(co * ci, 2), &[co, ci])?)
        } else {
            (
                Tensor::from_vec(data(batch * ci * hw * hw, 1), &[batch, ci, hw, hw])?,
                Tensor::from_vec(data(co * ci * k * k, 2), &[co, ci, k, k])?,
            )
        };
        let (name, args): (&str, Vec<Value>) = if k == 0 {
            ("linear", vec![(&x).into(), (&w).into(), (&bias).into()])
        } else {
            let p = (k / 2) as i64;
            let st = st as i64;
            (
                "conv2d",
                vec![
                    (&x).into(),
                    (&w).into(),
                    (&bias).into(),
                    Value::Ints(vec![st, st]),
                    Value::Ints(vec![p, p]),
                    Value::Ints(vec![1, 1]),
                    1i64.into(),
                ],
            )
        };
        op::call(name, args.clone(), vec![])?;
        return Ok(Box::new(move || {
            let _g = ferrofx_core::autograd::no_grad();
            let _ = op::call(name, args.clone(), vec![]);
        }));
    }
    let w_scale: Vec<f32> = (0..co).map(|j| 0.002 + (j % 11) as f32 * 1e-4).collect();
    let ws = Tensor::from_vec(w_scale, &[co])?;
    let wv: Vec<i8> = bytes(co * ci * k.max(1) * k.max(1), 2).into_iter().map(|b| (b as i8) / 2).collect();
    if k == 0 {
        let x = Tensor::from_vec(bytes(batch * ci, 1), &[batch, ci])?;
        let w = Tensor::from_vec(wv, &[co, ci])?;
        quantized_linear(&x, 0.02, 128, &w, &ws, Some(&bias), 0.05, 64, false)?;
        return Ok(Box::new(move || {
            let _ = quantized_linear(&x, 0.02, 128, &w, &ws, Some(&bias), 0.05, 64, false);
        }));
    }
    let x = Tensor::from_vec(bytes(batch * ci * hw * hw, 1), &[batch, ci, hw, hw])?;
    // in the converted model the inputs on planes of at most 16x16 come channels-last from the
    // int8 conv or add before (see ferrofx-core's `quantized/channels_last.rs`); unless
    // FERROFX_QCONV_NHWC=0 turns that layout off
    let x = if hw * hw <= 256 && std::env::var("FERROFX_QCONV_NHWC").map_or(true, |v| v != "0") {
        x.permute(&[0, 2, 3, 1])?.contiguous()?.permute(&[0, 3, 1, 2])?
    } else {
        x
    };
    let w = Tensor::from_vec(wv, &[co, ci, k, k])?;
    let p = (k / 2) as i64;
    let conv = QuantizedConv2dArgs { stride: [st as i64; 2], padding: [p, p], ..Default::default() };
    quantized_conv2d(&x, 0.02, 128, &w, &ws, Some(&bias), 0.05, 64, &conv)?;
    Ok(Box::new(move || {
        let _ = quantized_conv2d(&x, 0.02, 128, &w, &ws, Some(&bias), 0.05, 64, &conv);
    }))
}

/// `(shape, batch)` of case pair `i` (cases `2i`: int8, `2i + 1`: float).
static CASES: std::sync::LazyLock<Vec<(Shape, usize)>> =
    std::sync::LazyLock::new(|| SHAPES.iter().flat_map(|&(s, _, _)| BATCHES.iter().map(move |&b| (s, b))).collect());

macro_rules! setups {
    ($($i:literal)*) => {
        /// One setup function per case index (`Case::setup` is a plain `fn`).
        const SETUPS: &[fn() -> Result<Runner>] = &[$(|| setup($i)),*];
    };
}
setups!(0 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20 21 22 23 24 25 26 27 28 29 30 31 32 33 34 35 36 37 38 39
        40 41 42 43 44 45 46 47 48 49 50 51 52 53 54 55 56 57 58 59 60 61 62 63 64 65 66 67 68 69 70 71 72 73 74 75 76
        77 78 79 80 81 82 83 84 85 86 87 88 89 90 91 92 93 94 95 96 97 98 99 100 101 102 103 104 105 106 107 108 109
        110 111 112 113 114 115 116 117 118 119 120 121 122 123);

/// The transformer encoder's linear layers (`in -> out`, 384d, ff 1536; in_proj as one 384 ->
/// 1152 product) on 128 tokens, as dynamically quantized linears (`quantized_linear_dynamic`,
/// the float input quantized per call) against the float linear of the same shape.
const DYNAMIC: &[(usize, usize)] = &[(384, 1152), (384, 384), (384, 1536), (1536, 384)];
/// Rows (tokens) of the dynamic cases.
const DYNAMIC_ROWS: usize = 128;

/// The case id of dynamic linear `i` (`_f32` appended for the float case).
fn dynamic_id(i: usize, float: bool) -> String {
    let (ci, co) = DYNAMIC[i];
    format!("qlinear_dyn_{ci}x{co}_m{DYNAMIC_ROWS}{}", if float { "_f32" } else { "" })
}

fn dynamic_setup(i: usize, float: bool) -> Result<Runner> {
    let (k, n) = DYNAMIC[i];
    let m = DYNAMIC_ROWS;
    let x = Tensor::from_vec(data(m * k, 1), &[m, k])?;
    let bias = Tensor::from_vec(data(n, 5), &[n])?;
    if float {
        let w = Tensor::from_vec(data(n * k, 2), &[n, k])?;
        let args: Vec<Value> = vec![(&x).into(), (&w).into(), (&bias).into()];
        op::call("linear", args.clone(), vec![])?;
        return Ok(Box::new(move || {
            let _g = ferrofx_core::autograd::no_grad();
            let _ = op::call("linear", args.clone(), vec![]);
        }));
    }
    let w = Tensor::from_vec(bytes(n * k, 2).into_iter().map(|b| (b as i8) / 2).collect::<Vec<_>>(), &[n, k])?;
    let ws = Tensor::from_vec((0..n).map(|j| 0.002 + (j % 11) as f32 * 1e-4).collect::<Vec<_>>(), &[n])?;
    quantized_linear_dynamic(&x, &w, &ws, Some(&bias), false)?;
    Ok(Box::new(move || {
        let _ = quantized_linear_dynamic(&x, &w, &ws, Some(&bias), false);
    }))
}

/// One setup per dynamic case (int8, float) x shape.
const DYNAMIC_SETUPS: &[fn() -> Result<Runner>] = &[
    || dynamic_setup(0, false),
    || dynamic_setup(0, true),
    || dynamic_setup(1, false),
    || dynamic_setup(1, true),
    || dynamic_setup(2, false),
    || dynamic_setup(2, true),
    || dynamic_setup(3, false),
    || dynamic_setup(3, true),
];

/// The cases of the group.
pub fn all() -> Vec<Case> {
    assert_eq!(SETUPS.len(), 2 * CASES.len(), "one setup per case");
    assert_eq!(DYNAMIC_SETUPS.len(), 2 * DYNAMIC.len(), "one setup per dynamic case");
    let leak = |s: String| -> &'static str { Box::leak(s.into_boxed_str()) };
    let mut out = Vec::new();
    for (i, &(s, batch)) in CASES.iter().enumerate() {
        let (ci, co, k, st, hw) = s;
        for float in [false, true] {
            let kind = if float { "float" } else { "int8" };
            let what = if k == 0 {
                format!("{kind} linear {ci}->{co}, batch {batch}")
            } else {
                format!("{kind} conv {k}x{k}/{st} {ci}->{co} @{hw}, batch {batch}")
            };
            out.push(Case {
                id: leak(id(s, batch, float)),
                group: "qkernels",
                what: leak(what),
                work: Some((2.0 * macs(s, batch), "GOP/s")),
                inner: 1,
                setup: SETUPS[2 * i + usize::from(float)],
            });
        }
    }
    for (i, &(ci, co)) in DYNAMIC.iter().enumerate() {
        for float in [false, true] {
            let kind = if float { "float linear" } else { "dynamic int8 linear (input quantized per call)" };
            out.push(Case {
                id: leak(dynamic_id(i, float)),
                group: "qkernels",
                what: leak(format!("{kind} {ci}->{co}, {DYNAMIC_ROWS} rows")),
                work: Some((2.0 * (DYNAMIC_ROWS * ci * co) as f64, "GOP/s")),
                inner: 1,
                setup: DYNAMIC_SETUPS[2 * i + usize::from(float)],
            });
        }
    }
    out
}

fn ms(s: f64) -> String {
    format!("{:.3}", s * 1e3)
}

fn ratio(a: Option<f64>, b: Option<f64>) -> String {
    match (a, b) {
        (Some(a), Some(b)) if b > 0.0 => format!("{:.2}x", a / b),
        _ => "–".into(),
    }
}

/// The per-layer table (ms; ratios > 1: ferrofx int8 is faster) and the per-network sums;
/// empty when no case of the group ran.
pub fn summary(
    ours: &BTreeMap<&str, std::result::Result<f64, String>>,
    torch: Option<&BTreeMap<String, f64>>,
) -> String {
    let get_ours = |id: &str| ours.get(id).and_then(|r| r.as_ref().ok().copied());
    let get_torch = |id: &str| torch.and_then(|t| t.get(id).copied());
    if !CASES.iter().any(|&(s, b)| get_ours(&id(s, b, false)).is_some())
        && !(0..DYNAMIC.len()).any(|i| get_ours(&dynamic_id(i, false)).is_some())
    {
        return String::new();
    }
    let kernel = ferrofx_core::ops::quantized::int8_kernel();
    let mut md = format!(
        "\nInt8 kernels per layer (group qkernels; ferrofx int8 kernel: {kernel}; times in ms; PyTorch int8 = \
         torch.ops.quantized.conv2d/linear, fbgemm, channels-last input):\n\n\
         | layer | batch | ferrofx int8 | PyTorch int8 | ferrofx f32 | PyTorch f32 | int8 vs PyTorch int8 | int8 vs ferrofx f32 |\n\
         |---|---|---|---|---|---|---|---|\n"
    );
    // per network and batch: sums of (ours int8, torch int8, ours f32) over the layers present
    let mut sums: BTreeMap<(&str, usize), [f64; 3]> = BTreeMap::new();
    let mut complete: BTreeMap<(&str, usize), bool> = BTreeMap::new();
    for &(s, n18, n50) in SHAPES {
        for &b in &BATCHES {
            let (qi, fi) = (id(s, b, false), id(s, b, true));
            let (oq, tq, of, tf) = (get_ours(&qi), get_torch(&qi), get_ours(&fi), get_torch(&fi));
            if oq.is_none() && of.is_none() {
                continue;
            }
            let cell = |v: Option<f64>| v.map(ms).unwrap_or_else(|| "–".into());
            md.push_str(&format!(
                "| {} | {b} | {} | {} | {} | {} | {} | {} |\n",
                qi.trim_end_matches(&format!("_b{b}")),
                cell(oq),
                cell(tq),
                cell(of),
                cell(tf),
                ratio(tq, oq),
                ratio(of, oq)
            ));
            for (net, count) in [("ResNet-18", n18), ("ResNet-50", n50)] {
                if count == 0 {
                    continue;
                }
                let e = sums.entry((net, b)).or_insert([0.0; 3]);
                let ok = complete.entry((net, b)).or_insert(true);
                match (oq, tq, of) {
                    (Some(a), Some(t), Some(f)) => {
                        e[0] += a * count as f64;
                        e[1] += t * count as f64;
                        e[2] += f * count as f64;
                    }
                    _ => *ok = false,
                }
            }
        }
    }
    let dynamic_rows: Vec<String> = (0..DYNAMIC.len())
        .filter_map(|i| {
            let (qi, fi) = (dynamic_id(i, false), dynamic_id(i, true));
            let (oq, tq, of, tf) = (get_ours(&qi), get_torch(&qi), get_ours(&fi), get_torch(&fi));
            oq.map(|_| {
                let cell = |v: Option<f64>| v.map(ms).unwrap_or_else(|| "–".into());
                format!(
                    "| {} | {} | {} | {} | {} | {} | {} |\n",
                    qi,
                    cell(oq),
                    cell(tq),
                    cell(of),
                    cell(tf),
                    ratio(tq, oq),
                    ratio(of, oq)
                )
            })
        })
        .collect();
    if !dynamic_rows.is_empty() {
        md.push_str(
            "\nDynamic int8 linears of the transformer (128 tokens; the float input quantized per call; PyTorch int8 = \
             torch.ops.quantized.linear_dynamic, fbgemm; times in ms):\n\n| layer | ferrofx int8 | PyTorch int8 | \
             ferrofx f32 | PyTorch f32 | int8 vs PyTorch int8 | int8 vs ferrofx f32 |\n|---|---|---|---|---|---|---|\n",
        );
        dynamic_rows.iter().for_each(|r| md.push_str(r));
    }
    if sums.is_empty() {
        return md;
    }
    md.push_str(
        "\nSums over each network's conv and linear layers (each layer times its multiplicity; no pooling, \
         adds or quantize/dequantize):\n\n| network | batch | ferrofx int8 | PyTorch int8 | ferrofx f32 | int8 vs \
         PyTorch int8 | int8 vs ferrofx f32 |\n|---|---|---|---|---|---|---|\n",
    );
    for ((net, b), [a, t, f]) in &sums {
        if !complete[&(*net, *b)] {
            md.push_str(&format!("| {net} | {b} | (some layers not measured) | | | | |\n"));
            continue;
        }
        md.push_str(&format!(
            "| {net} | {b} | {} | {} | {} | {} | {} |\n",
            ms(*a),
            ms(*t),
            ms(*f),
            ratio(Some(*t), Some(*a)),
            ratio(Some(*f), Some(*a))
        ));
    }
    md
}
