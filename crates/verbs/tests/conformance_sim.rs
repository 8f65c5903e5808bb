//! The conformance suite on the `sim` backend.
dmkit_verbs::conformance_tests!(dmkit_verbs::conformance::SimHarness::new());
