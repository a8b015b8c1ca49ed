// swift-tools-version:5.9
import PackageDescription

// MLXKernMLX: mlxkern's kernels on an mlx-swift app's own MLX. An `MLXArray` goes into the
// kernels and comes back as an `MLXArray` without a copy, and unevaluated arrays stay lazy
// through the kernels' nodes: one graph, one `eval`.
//
// The app's MLX is the one mlx-swift compiles into it (target Cmlx), so the library linked
// here is libmlxkern's static archive built against that MLX's sources ("host MLX" mode:
// scripts/swift/mlx-lib.sh builds it and writes the mlxkern.pc that points SwiftPM at it; see
// ../../docs/hosts/swift.md, "One MLX in an mlx-swift app"). Linking the bundled shared library (with its
// own libmlx) instead gives two MLXs in one process, and the library then refuses every
// exchange.
//
// mlx-swift: the GitHub package, as an app names it (SwiftPM then uses one mlx-swift for both),
// unless MLX_SWIFT_PATH names a local checkout (offline builds and this repository's tests).
// This is a package of its own so that the MLXKern package (..) never resolves mlx-swift.
let mlxSwift: Package.Dependency
if let path = Context.environment["MLX_SWIFT_PATH"], !path.isEmpty {
    mlxSwift = .package(path: path)
} else {
    mlxSwift = .package(url: "https://github.com/ml-explore/mlx-swift", from: "0.31.0")
}

let package = Package(
    name: "MLXKernMLX",
    platforms: [.macOS(.v14), .iOS(.v17)],
    products: [
        .library(name: "MLXKernMLX", targets: ["MLXKernMLX"]),
    ],
    dependencies: [
        .package(name: "MLXKern", path: ".."),
        mlxSwift,
    ],
    targets: [
        .target(
            name: "MLXKernMLX",
            dependencies: [
                .product(name: "MLXKern", package: "MLXKern"),
                .product(name: "MLX", package: "mlx-swift"),
            ]
        ),
        .testTarget(name: "MLXKernMLXTests", dependencies: ["MLXKernMLX"]),
    ]
)
