// swift-tools-version:5.9
import PackageDescription

// The Swift package over libmlxkern, the C ABI built by cargo from the repository root.
//
// Where the library is found, at link time and at run time: MLXKERN_LIB_DIR if set, else the
// repository's target/debug (what `cargo build` / `make build` produce). The folder goes to the
// linker as -L and as an rpath, so `swift build` and `swift test` need no DYLD_/LD_LIBRARY_PATH.
// libmlxkern itself carries an rpath to the libmlx it was built against (the project's .venv).
//
// SwiftPM accepts these unsafeFlags in a root package and in a dependency added by local path
// (`.package(path: ...)`) or by branch; a dependency pinned to a version tag may not carry them:
// such an app passes the same flags itself (Xcode: "Library Search Paths" and
// "Runpath Search Paths"). See README.md.
let packageDirectory = Context.packageDirectory
let repositoryRoot = String(packageDirectory[..<packageDirectory.lastIndex(of: "/")!])
let libraryDirectory = Context.environment["MLXKERN_LIB_DIR"] ?? repositoryRoot + "/target/debug"

let package = Package(
    name: "MLXKern",
    platforms: [.macOS(.v13)],
    products: [
        .library(name: "MLXKern", targets: ["MLXKern"]),
    ],
    targets: [
        // The C declarations: a module map over the repository's generated header
        // (include/mlxkern.h, by relative path: there is no copy to keep in sync).
        .systemLibrary(name: "CMLXKern", path: "Sources/CMLXKern"),
        .target(
            name: "MLXKern",
            dependencies: ["CMLXKern"],
            linkerSettings: [
                .unsafeFlags([
                    "-L", libraryDirectory,
                    "-Xlinker", "-rpath", "-Xlinker", libraryDirectory,
                ]),
            ]
        ),
        .testTarget(name: "MLXKernTests", dependencies: ["MLXKern"]),
    ]
)
