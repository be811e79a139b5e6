//! Issue 8: per-node FLOPs and activation memory, per-module totals, the tabular view and the
//! node-level profiler, on ResNet-18 (shapes from a trace with an example input).

use ferrofx_core::ops::random::{manual_seed, randn};
use ferrofx_core::Value;
use ferrofx_fx::passes::analysis::{module_stats, node_stats, profile, tabular};
use ferrofx_fx::passes::flops::count_macs;
use ferrofx_fx::trace_with_inputs;
use ferrofx_nn::zoo::ResNet;
use ferrofx_nn::Module;

#[test]
fn resnet18_flops_per_node_add_up_to_the_mac_count_and_modules_nest() {
    manual_seed(1);
    let mut m = ResNet::resnet18(1000).unwrap();
    m.eval();
    let x = randn(&[1, 3, 224, 224], None).unwrap();
    let gm = trace_with_inputs(&m, &[Value::Tensor(x.clone())]).unwrap();
    let stats = node_stats(&gm).unwrap();
    assert_eq!(stats.len(), gm.graph().len());

    // convolutions and the classifier: exactly twice torchvision's MAC count
    let macs = count_macs(&m, &[Value::Tensor(x)]).unwrap().total;
    let matmul_flops: u64 = stats
        .iter()
        .filter(|s| s.target.contains("conv") || s.target.contains("downsample.0") || s.target == "fc")
        .map(|s| s.flops)
        .sum();
    assert_eq!(matmul_flops, 2 * macs);
    assert!((macs as f64 - 1.814e9).abs() / 1.814e9 < 0.01, "{macs}");

    // activation memory: the stem conv writes [1, 64, 112, 112] f32
    let conv1 = stats.iter().find(|s| s.name == "conv1").unwrap();
    assert_eq!(conv1.shape.as_deref(), Some(&[1, 64, 112, 112][..]));
    assert_eq!(conv1.output_bytes, 64 * 112 * 112 * 4);

    // per-module totals nest: layer1 = layer1.0 + layer1.1, the top level holds everything
    let per = module_stats(&stats);
    let total: u64 = stats.iter().map(|s| s.flops).sum();
    assert_eq!(per[""].0, total);
    assert_eq!(per["layer1"].0, per["layer1.0"].0 + per["layer1.1"].0);
    assert!(per["layer4"].0 > 0 && per["layer1.0.conv1"].0 > 0);

    // the tabular view has every node, the analysis columns and a total line
    let t = tabular(&gm).unwrap();
    let lines: Vec<&str> = t.lines().collect();
    assert!(lines[0].starts_with("opcode") && lines[0].contains("shape") && lines[0].contains("FLOPs"), "{t}");
    assert_eq!(lines.len(), 2 + stats.len() + 1, "{t}");
    assert!(
        lines.iter().any(|l| l.contains("conv1") && l.contains("[1, 64, 112, 112]") && l.contains("float32")),
        "{t}"
    );
    assert!(lines.last().unwrap().starts_with("total") && lines.last().unwrap().contains('G'), "{t}");
}

#[test]
fn the_profiler_times_every_node_and_module() {
    manual_seed(2);
    let mut m = ResNet::build(false, [1, 1, 1, 1], [8, 16, 32, 64], 10).unwrap();
    m.eval();
    let x = randn(&[1, 3, 32, 32], None).unwrap();
    let gm = trace_with_inputs(&m, &[Value::Tensor(x.clone())]).unwrap();
    let p = profile(&gm, &[Value::Tensor(x)], 2).unwrap();
    let calls = gm.graph().iter().filter(|n| !matches!(n.op().as_str(), "placeholder" | "output")).count();
    assert_eq!(p.nodes.len(), calls);
    assert!(p.nodes.windows(2).all(|w| w[0].time >= w[1].time), "sorted, slowest first");
    assert!(p.total().as_nanos() > 0);
    let all = p.modules.iter().find(|(m, _)| m.is_empty()).map(|(_, t)| *t).unwrap();
    assert_eq!(all, p.total());
    let layer1 = p.modules.iter().find(|(m, _)| m == "layer1").map(|(_, t)| *t).unwrap();
    assert!(layer1 <= all && layer1.as_nanos() > 0);
    let table = p.table(5);
    assert!(table.starts_with("node") && table.contains("(all)") && table.contains('%'), "{table}");
    assert!(profile(&gm, &[], 0).unwrap_err().to_string().contains("runs must be at least 1"));
}
