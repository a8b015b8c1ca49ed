// swift-tools-version:5.9
import PackageDescription

// The Swift package over libmlxkern, the C library built by cargo from the repository root.
//
// The manifest carries no unsafe flags, so the package can be a dependency of another package
// (SwiftPM refuses `unsafeFlags` in a dependency pinned to a version). How the linker finds
// libmlxkern (the module map links `mlxkern`):
//   - pkg-config: the `mlxkern.pc` SwiftPM finds on PKG_CONFIG_PATH or in the default folders
//     (scripts/package/install.sh installs one in PREFIX/lib/pkgconfig) gives `-L<libdir> -lmlxkern`.
//     SwiftPM drops the file's rpath flag ("prohibited flag(s)", a warning): at run time the
//     program finds the library through an rpath it sets itself, the system's library path or
//     LD_LIBRARY_PATH / DYLD_LIBRARY_PATH;
//   - or the command line: `swift build -Xlinker -L<dir> -Xlinker -rpath -Xlinker <dir>`
//     (scripts/test/swift.sh does so with the repository's target/debug);
//   - Xcode: "Library Search Paths" and "Runpath Search Paths" of the app target.
// See README.md, "Adding the package to an app".
//
// The product MLXKernMLX (mlxkern on an mlx-swift app's own MLX) is the package in
// MLXKernMLX/, beside this one: it depends on mlx-swift, which this package never resolves.
let package = Package(
    name: "MLXKern",
    platforms: [.macOS(.v13)],
    products: [
        .library(name: "MLXKern", targets: ["MLXKern"]),
    ],
    targets: [
        // The C declarations: a module map over the repository's generated header
        // (include/mlxkern.h, by relative path: there is no copy to keep in sync).
        .systemLibrary(name: "CMLXKern", path: "Sources/CMLXKern", pkgConfig: "mlxkern"),
        .target(name: "MLXKern", dependencies: ["CMLXKern"]),
        .testTarget(name: "MLXKernTests", dependencies: ["MLXKern"]),
    ]
)
