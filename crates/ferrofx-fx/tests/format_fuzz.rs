//! A short, seeded mutation-fuzzing run of the traced-module loader (long runs:
//! `cargo run --release -p ferrofx-fx --example fuzz_loader -- --seconds 600`).

#[path = "support/mutate.rs"]
mod mutate;

#[test]
fn seed_files_load() {
    for s in mutate::seeds() {
        mutate::load(&s).unwrap();
    }
}

#[test]
fn mutated_files_never_panic() {
    let seeds = mutate::seeds();
    let r = mutate::run(0xF3_2026, 4000, None, &seeds);
    assert!(r.panics.is_empty(), "{} of {} mutated files panicked the loader", r.panics.len(), r.iterations);
    assert_eq!(r.iterations, 4000);
    // the mutations must exercise both outcomes, or the run proves nothing
    assert!(r.rejected > 1000, "{r:?}");
    assert!(r.accepted > 0, "{r:?}");
}
