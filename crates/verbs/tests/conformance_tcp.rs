//! The conformance suite on the `tcp` backend (loopback servers in this process).
dmkit_verbs::conformance_tests!(dmkit_verbs::conformance::TcpHarness::new());

/// The whole suite again with a cluster secret: admission must not change behaviour.
mod with_secret {
    dmkit_verbs::conformance_tests!(dmkit_verbs::conformance::TcpHarness::with_secret(Some(
        b"correct horse battery staple"
    )));
}
