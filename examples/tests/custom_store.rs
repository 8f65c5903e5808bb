//! The custom store example runs to its last line: in-process (sim), and across memory-node
//! processes over tcp (the example binary `cargo test` builds beside this test).

#[path = "../examples/custom_store.rs"]
#[allow(dead_code)]
mod custom_store;

#[test]
fn custom_store_runs_on_sim() {
    custom_store::main().expect("custom_store on sim");
}

#[test]
fn custom_store_runs_across_memnode_processes_over_tcp() {
    // target/<profile>/deps/<this test> -> target/<profile>/examples/custom_store
    let exe = std::env::current_exe().unwrap();
    let example = exe
        .parent()
        .and_then(|d| d.parent())
        .map(|d| d.join("examples").join("custom_store"))
        .unwrap();
    assert!(
        example.exists(),
        "{} is missing: cargo test builds the package's examples",
        example.display()
    );
    let out = std::process::Command::new(&example)
        .args(["--backend", "tcp"])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        stdout.trim_end().ends_with("custom_store: ok 1000 keys"),
        "{stdout}"
    );
}
