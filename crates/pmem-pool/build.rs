//! Generates libpmem bindings when the `libpmem` feature is on; does nothing otherwise, so the
//! default build needs nothing but Rust.

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    #[cfg(feature = "libpmem")]
    libpmem::generate();
}

#[cfg(feature = "libpmem")]
mod libpmem {
    use std::env;
    use std::path::PathBuf;

    pub fn generate() {
        let lib = match pkg_config::Config::new()
            .atleast_version("1.0")
            .probe("libpmem")
        {
            Ok(lib) => lib,
            Err(e) => panic!(
                "\n\ndmkit-pmem-pool: the `libpmem` feature needs libpmem, but pkg-config could \
                 not find it: {e}\n\
                 On Debian/Ubuntu: apt-get install libpmem-dev libclang-dev pkg-config\n\
                 Or build without `--features libpmem` (the default mmap + msync medium needs \
                 nothing but Rust).\n\n"
            ),
        };
        let mut builder = bindgen::Builder::default()
            .header_contents("wrapper.h", "#include <libpmem.h>\n")
            .allowlist_function("pmem_map_file")
            .allowlist_function("pmem_unmap")
            .allowlist_function("pmem_is_pmem")
            .allowlist_function("pmem_persist")
            .allowlist_function("pmem_msync")
            .allowlist_function("pmem_memcpy_persist")
            .allowlist_function("pmem_errormsg")
            .allowlist_var("PMEM_FILE_.*")
            .layout_tests(false)
            .generate_comments(false);
        for dir in &lib.include_paths {
            builder = builder.clang_arg(format!("-I{}", dir.display()));
        }
        let bindings = builder.generate().unwrap_or_else(|e| {
            panic!(
                "\n\ndmkit-pmem-pool: bindgen could not generate libpmem bindings: {e}\n\
                 Is libclang installed? On Debian/Ubuntu: apt-get install libclang-dev\n\n"
            )
        });
        let out = PathBuf::from(env::var("OUT_DIR").expect("cargo sets OUT_DIR"));
        bindings
            .write_to_file(out.join("libpmem_sys.rs"))
            .expect("write libpmem bindings to OUT_DIR");
    }
}
