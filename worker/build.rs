//! Compiles the image pipeline's JPEG layer (`src/image/jpeg_turbo.c`)
//! against the system's libjpeg-turbo (Debian: libjpeg62-turbo-dev), which
//! brings SIMD decoding, DCT scaling and region decoding.

fn main() {
    println!("cargo:rerun-if-changed=src/image/jpeg_turbo.c");
    cc::Build::new().file("src/image/jpeg_turbo.c").opt_level(2).warnings(true).compile("loader_jpeg_turbo");
    println!("cargo:rustc-link-lib=jpeg");
}
