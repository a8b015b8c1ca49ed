import Cmlx
import Foundation
import MLX
import MLXKernMLX
import XCTest

// Shared by the tests: mlx-swift on the CPU (mlx-swift 0.31.4 makes the GPU the default device
// on Linux and stops at the first op without one), a seeded random source (fresh inputs every
// run, reproducible with MLXKERN_TEST_SEED), and readers of the raw bits on both sides.

/// Runs once, before any MLX work of a test.
let useCPU: Void = {
    #if os(Linux)
    Device.setDefault(device: Device.cpu)
    #endif
}()

/// SplitMix64, seeded from MLXKERN_TEST_SEED if set, else at random; the seed is printed.
struct SeededGenerator: RandomNumberGenerator {
    private var state: UInt64
    let seed: UInt64

    init(_ test: String = #function) {
        let fixed = ProcessInfo.processInfo.environment["MLXKERN_TEST_SEED"].flatMap { UInt64($0) }
        seed = fixed ?? UInt64.random(in: 0...UInt64.max)
        state = seed
        print("\(test): MLXKERN_TEST_SEED=\(seed)")
    }

    mutating func next() -> UInt64 {
        state &+= 0x9E37_79B9_7F4A_7C15
        var z = state
        z = (z ^ (z >> 30)) &* 0xBF58_476D_1CE4_E5B9
        z = (z ^ (z >> 27)) &* 0x94D0_49BB_1331_11EB
        return z ^ (z >> 31)
    }

    mutating func uniforms(_ count: Int, in range: ClosedRange<Float> = -1...1) -> [Float] {
        (0..<count).map { _ in Float.random(in: range, using: &self) }
    }
}

/// The float32 bit patterns of an evaluated float32 `MLXArray` (row-major, via a copy).
func bits(_ array: MLXArray) -> [UInt32] {
    array.asType(.float32).asArray(Float.self).map(\.bitPattern)
}

func bits(_ values: [Float]) -> [UInt32] { values.map(\.bitPattern) }

/// Whether MLX has computed `array` (mlx-c's `_mlx_array_is_available`).
func isEvaluated(_ array: MLXArray) -> Bool {
    var available = false
    XCTAssertEqual(_mlx_array_is_available(&available, array.ctx), 0)
    return available
}

/// The address of an evaluated array's data (its buffer plus the view's offset).
func dataAddress(_ array: MLXArray) -> UnsafeRawPointer? {
    UnsafeRawPointer(mlx_array_data_uint8(array.ctx))
}

/// An `MLXArray` of `shape` from float32 `values`, stored as `dtype`.
func mlxArray(_ values: [Float], _ shape: [Int], _ dtype: MLX.DType = .float32) -> MLXArray {
    let array = MLXArray(values, shape)
    return dtype == .float32 ? array : array.asType(dtype)
}
