//! Regenerates the prost code for onnx.proto (no protoc needed: protox parses the schema).
fn main() {
    let mut args = std::env::args().skip(1);
    let proto = args.next().expect("usage: gen_proto ONNX_PROTO OUT_DIR");
    let out = args.next().expect("usage: gen_proto ONNX_PROTO OUT_DIR");
    let dir = std::path::Path::new(&proto).parent().expect("proto path has a parent").to_path_buf();
    let fds = protox::compile([&proto], [&dir]).expect("onnx.proto compiles");
    let mut cfg = prost_build::Config::new();
    cfg.out_dir(&out);
    cfg.compile_fds(fds).expect("prost-build generates");
}
