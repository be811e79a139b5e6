//! A short, seeded mutation-fuzzing run of the ONNX importer (issue 23, acceptance 5; long
//! runs: `cargo run --release -p ferrofx-onnx --example fuzz_import -- --seconds 600`).

use crate::mutate;

#[test]
fn seed_models_import_and_run() {
    for (i, s) in mutate::seeds().iter().enumerate() {
        assert_eq!(mutate::import_and_run(s), mutate::Outcome::Ran, "seed {i}");
    }
}

#[test]
fn mutated_models_never_panic() {
    let seeds = mutate::seeds();
    let r = mutate::run(0x0E_2026, 3000, None, &seeds);
    assert!(
        r.panics.is_empty(),
        "{} of {} mutated models panicked the importer: {:?}",
        r.panics.len(),
        r.iterations,
        r.messages
    );
    assert_eq!(r.iterations, 3000);
    // the mutations must exercise both outcomes, or the run proves nothing
    assert!(r.rejected > 300, "{r:?}");
    assert!(r.ran > 100, "{r:?}");
}
