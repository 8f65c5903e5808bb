//! Stores composed from dmkit's layer crates alone; the code is in `examples/` (run them with
//! `cargo run -p dmkit-examples --example <name>`), the walkthrough in `docs/COMPOSING.md`.
