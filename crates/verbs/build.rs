//! Build script of dmkit-verbs. Without feature `rdma` it does nothing (the default build is
//! pure Rust). With it, it finds rdma-core with pkg-config, generates bindings to libibverbs
//! and librdmacm with bindgen, and compiles C wrappers for the verbs that rdma-core defines as
//! static inline functions (bindgen's `wrap_static_fns`) or as macros (`ibv_reg_mr`,
//! `ibv_query_port`, wrapped by hand in `src/rdma/shim.c`).

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    #[cfg(feature = "rdma")]
    rdma::generate();
}

#[cfg(feature = "rdma")]
mod rdma {
    use std::path::PathBuf;

    const PACKAGES: &str = "libibverbs-dev librdmacm-dev libclang-dev pkg-config";

    fn probe(name: &str) -> pkg_config::Library {
        match pkg_config::Config::new().atleast_version("1.0").probe(name) {
            Ok(lib) => lib,
            Err(e) => {
                eprintln!(
                    "\nerror: feature `rdma` of dmkit-verbs needs rdma-core's {name} (found with \
                     pkg-config), which was not found.\n  Install on Debian/Ubuntu: \
                     apt-get install -y --no-install-recommends {PACKAGES}\n  (or build without \
                     `--features rdma`: the sim and tcp backends need nothing but Rust)\n  \
                     pkg-config said: {e}\n"
                );
                panic!("rdma-core ({name}) not found by pkg-config: apt-get install {PACKAGES}");
            }
        }
    }

    pub fn generate() {
        println!("cargo:rerun-if-changed=src/rdma/shim.c");
        println!("cargo:rerun-if-env-changed=PKG_CONFIG_PATH");
        let verbs = probe("libibverbs");
        let cm = probe("librdmacm");
        let out = PathBuf::from(std::env::var("OUT_DIR").expect("OUT_DIR"));
        let header = out.join("dmkit_rdma.h");
        std::fs::write(
            &header,
            "#include <infiniband/verbs.h>\n#include <rdma/rdma_cma.h>\n",
        )
        .expect("write the bindgen header");
        // bindgen appends ".c" to this path.
        let wrappers = out.join("dmkit_rdma_extern");
        let include_args: Vec<String> = verbs
            .include_paths
            .iter()
            .chain(cm.include_paths.iter())
            .map(|p| format!("-I{}", p.display()))
            .collect();

        let bindings = bindgen::Builder::default()
            .header(header.to_string_lossy())
            .clang_args(&include_args)
            .allowlist_function("ibv_.*")
            .allowlist_function("rdma_.*")
            .allowlist_type("ibv_.*")
            .allowlist_type("rdma_.*")
            .allowlist_var("IBV_.*")
            .allowlist_var("RDMA_.*")
            // Static inline verbs (ibv_post_send, ibv_poll_cq, ...) become real symbols.
            .wrap_static_fns(true)
            .wrap_static_fns_path(&wrappers)
            .wrap_static_fns_suffix("__dmkit_extern")
            .derive_default(true)
            .derive_debug(false)
            .prepend_enum_name(false)
            .bitfield_enum("ibv_access_flags")
            .bitfield_enum("ibv_send_flags")
            .bitfield_enum("ibv_qp_attr_mask")
            .layout_tests(false)
            .generate_comments(false)
            .generate()
            .unwrap_or_else(|e| {
                panic!(
                    "bindgen could not generate rdma-core bindings ({e}); is libclang installed? \
                     apt-get install {PACKAGES}"
                )
            });
        bindings
            .write_to_file(out.join("rdma_bindings.rs"))
            .expect("write rdma bindings");

        let mut build = cc::Build::new();
        build
            .file(out.join("dmkit_rdma_extern.c"))
            .file("src/rdma/shim.c")
            .include(&out)
            .warnings(false);
        for p in verbs.include_paths.iter().chain(cm.include_paths.iter()) {
            build.include(p);
        }
        build.compile("dmkit_rdma_wrappers");
        // pkg-config already asked cargo to link ibverbs and rdmacm.
    }
}
