//! Export of registry ops that have no single ONNX equivalent (`scaled_dot_product_attention`
//! with no mask, a causal mask, a boolean and an additive mask; `unflatten`): the exported
//! file re-imports to the same values, and (with the checker Python) passes
//! `onnx.checker.check_model(full_check=True)` and runs in onnxruntime to the same values.

use crate::common::max_rel_err;
use ferrofx_core::ops::attention::scaled_dot_product_attention;
use ferrofx_core::{Tensor, Value};
use ferrofx_nn::*;
use ferrofx_onnx::{import, ExportOptions, ImportOptions};
use prost::Message;

/// `x [2, 3, 5, 8]` attends to itself in the four mask modes; the heads are merged with
/// `flatten` and split again with `unflatten`.
#[derive(Module)]
struct Attention {
    /// Which mask: 0 none, 1 causal, 2 boolean, 3 additive.
    mode: usize,
}

impl Module for Attention {
    fn forward(&self, x: &Tensor) -> ferrofx_core::Result<Tensor> {
        let k = (x * 0.5)?;
        let mask_bool = Tensor::from_vec((0..25).map(|i| i % 3 != 1).collect::<Vec<bool>>(), &[5, 5])?;
        let mask_add = Tensor::from_vec((0..25).map(|i| (i % 7) as f32 * -0.25).collect::<Vec<f32>>(), &[5, 5])?;
        let y = match self.mode {
            0 => scaled_dot_product_attention(x, &k, x, None, false, None)?,
            1 => scaled_dot_product_attention(x, &k, x, None, true, Some(0.3))?,
            2 => scaled_dot_product_attention(x, &k, x, Some(&mask_bool), false, None)?,
            _ => scaled_dot_product_attention(x, &k, x, Some(&mask_add), false, None)?,
        };
        y.flatten(2, 3)?.unflatten(2, &[5, 8])
    }
}

#[test]
fn attention_and_unflatten_export_and_run_in_onnxruntime() {
    let out_dir = std::env::temp_dir().join(format!("ferrofx-onnx-export-ops-{}", std::process::id()));
    std::fs::create_dir_all(&out_dir).expect("temporary folder");
    let x = ferrofx_core::ops::random::randn(&[2, 3, 5, 8], None).unwrap();
    for mode in 0..4 {
        let name = ["sdpa_plain", "sdpa_causal", "sdpa_bool_mask", "sdpa_float_mask"][mode];
        let m = Attention { mode };
        let want = m.call(&x).unwrap();
        let gm = ferrofx_fx::symbolic_trace(&m).unwrap();
        assert!(
            gm.graph().iter().any(|n| n.name().starts_with("scaled_dot_product_attention")),
            "{name}: the traced graph calls the fused attention op"
        );
        let proto = ferrofx_onnx::export(&gm, std::slice::from_ref(&x), &ExportOptions::default())
            .unwrap_or_else(|e| panic!("{name}: export: {e}"));
        let path = out_dir.join(format!("{name}.onnx"));
        ferrofx_onnx::export::save(&proto, &path).unwrap();
        let again = import(&path, &ImportOptions::default()).unwrap_or_else(|e| panic!("{name}: re-import: {e}"));
        let got = match again.module.forward_values(&[Value::Tensor(x.clone())]).unwrap().as_slice() {
            [Value::Tensor(t)] => t.clone(),
            other => panic!("{name}: {} outputs", other.len()),
        };
        assert_eq!(got.shape(), want.shape(), "{name}");
        let err = max_rel_err(&got, &want, 1e-6).unwrap();
        assert!(err <= 1e-6, "{name}: re-imported export differs by {err:.2e}");
        for (t, file) in [(&x, "input"), (&want, "ferrofx")] {
            let bytes = ferrofx_onnx::tensor_proto::tensor_to_proto(t, file).unwrap().encode_to_vec();
            std::fs::write(out_dir.join(format!("{name}.{file}.pb")), bytes).unwrap();
        }
    }
    let checked = crate::zoo::check_with_onnxruntime(&out_dir);
    let _ = std::fs::remove_dir_all(&out_dir);
    if let Err(e) = checked {
        panic!("{e}");
    }
}
