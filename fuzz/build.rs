//! The fuzz targets load libmlx like every other artifact: an rpath to the MLX folder that
//! mlxkern's build script found (it exports it as `links = "mlx"` metadata: DEP_MLX_MLX_DIR).
fn main() {
    println!("cargo:rerun-if-env-changed=DEP_MLX_MLX_DIR");
    if let Ok(dir) = std::env::var("DEP_MLX_MLX_DIR") {
        println!("cargo:rustc-link-arg=-Wl,-rpath,{dir}/lib");
    }
}
