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

/// The workflow seeds reach both sides: the shipped files and the variant
/// with every kind of edge are accepted (so the acceptance checks run on
/// them), the broken ones are refused for the reason they were written for.
#[test]
fn workflow_seeds_are_accepted_or_refused_as_written() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("seeds/workflow_def");
    let load = |name: &str| {
        let text = std::fs::read_to_string(dir.join(name)).expect("read a seed");
        cadre_fuzz::load_workflow(&text).map(|wf| wf.nodes.len())
    };
    for (name, nodes) in [
        ("market-brief.toml", 4),
        ("account-review.toml", 5),
        ("session-when-map.toml", 4),
        ("when-nested.toml", 1),
    ] {
        assert_eq!(load(name).unwrap_or_else(|e| panic!("{name}: {e}")), nodes);
    }
    for (name, reason) in [
        ("cycle.toml", "cycle: a -> c -> b -> a"),
        ("unknown-node.toml", "output reads node 'ghost'"),
    ] {
        let e = load(name).expect_err(name).to_string();
        assert!(e.contains(reason), "{name}: {e}");
    }
}
