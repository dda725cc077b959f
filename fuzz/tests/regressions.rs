//! Replays the committed seeds (`seeds/<target>/*`), every committed
//! crashing input (`regressions/<target>/*`) and any local corpus
//! (`corpus/<target>/*`, not committed) through the target bodies, without
//! libFuzzer: `cargo test` in `fuzz/`.

use std::path::Path;

fn replay(dir: &Path) -> usize {
    let Ok(targets) = std::fs::read_dir(dir) else {
        return 0;
    };
    let mut n = 0;
    for target in targets.flatten() {
        let name = target.file_name().to_string_lossy().into_owned();
        let run = cadre_fuzz::target(&name)
            .unwrap_or_else(|| panic!("{}: no fuzz target named {name}", dir.display()));
        let mut inputs: Vec<_> = std::fs::read_dir(target.path())
            .expect("read the target's inputs")
            .flatten()
            .map(|e| e.path())
            .collect();
        inputs.sort();
        for input in inputs {
            let data = std::fs::read(&input).expect("read an input");
            eprintln!("{name}: {}", input.display());
            run(&data);
            n += 1;
        }
    }
    n
}

#[test]
fn every_target_accepts_its_seeds() {
    let n = replay(&Path::new(env!("CARGO_MANIFEST_DIR")).join("seeds"));
    assert!(n >= 4, "seed inputs missing");
}

#[test]
fn committed_crashing_inputs_no_longer_crash() {
    replay(&Path::new(env!("CARGO_MANIFEST_DIR")).join("regressions"));
}

#[test]
fn the_local_corpus_replays_cleanly() {
    replay(&Path::new(env!("CARGO_MANIFEST_DIR")).join("corpus"));
}
