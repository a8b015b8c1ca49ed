import Foundation
#if canImport(Glibc)
import Glibc
#endif
import MLX
import MLXKernMLX
import XCTest

// The bundled libmlxkern (a shared library carrying its own libmlx, the pip MLX 0.32.4) loaded
// into an mlx-swift program, whose MLX (0.31.1) is compiled in with its symbols not exported:
// two MLXs in one process, so both libraries must refuse every exchange, naming both copies.
// MLXKERN_TEST_BUNDLED_LIB names that library (scripts/test/mlx-swift.sh: target/debug's
// libmlxkern.so, in a test process of its own, since loading it leaves the process with two
// MLXs for good).

final class GuardTests: XCTestCase {
    override func setUp() {
        super.setUp()
        _ = useCPU
    }

    func testBundledLibraryRefusesBesideMLXSwift() throws {
        guard let path = ProcessInfo.processInfo.environment["MLXKERN_TEST_BUNDLED_LIB"], !path.isEmpty else {
            throw XCTSkip("MLXKERN_TEST_BUNDLED_LIB is not set (scripts/test/mlx-swift.sh sets it to "
                          + "target/debug/libmlxkern.so and runs this test in a process of its own)")
        }
        let program = try XCTUnwrap(realpath("/proc/self/exe", nil).map { p in defer { free(p) }; return String(cString: p) })
        let x = MLXArray([1, 2, 3, 4] as [Float], [2, 2])
        eval(x)
        // Before: one MLX, the exchange works.
        XCTAssertEqual(try MLXKArray(sharing: x).shape, [2, 2])

        guard let library = dlopen(path, RTLD_NOW | RTLD_LOCAL) else {
            return XCTFail("dlopen(\(path)): \(String(cString: dlerror()))")
        }
        func symbol<T>(_ name: String, _: T.Type) throws -> T {
            unsafeBitCast(try XCTUnwrap(dlsym(library, name), "\(name) in \(path)"), to: T.self)
        }
        let fromMLX = try symbol("mlxk_array_from_mlx",
                                 (@convention(c) (UnsafeRawPointer?, UnsafeMutablePointer<OpaquePointer?>?) -> Int32).self)
        let toMLX = try symbol("mlxk_array_to_mlx",
                               (@convention(c) (OpaquePointer?, UnsafeMutablePointer<UnsafeMutableRawPointer?>?) -> Int32).self)
        let zeros = try symbol("mlxk_array_zeros",
                               (@convention(c) (UnsafePointer<Int32>?, Int, Int32, UnsafeMutablePointer<OpaquePointer?>?) -> Int32).self)
        let arrayFree = try symbol("mlxk_array_free", (@convention(c) (OpaquePointer?) -> Int32).self)
        let lastError = try symbol("mlxk_last_error", (@convention(c) () -> UnsafePointer<CChar>?).self)
        let mlxVersion = try symbol("mlxk_mlx_version", (@convention(c) () -> UnsafePointer<CChar>?).self)
        let bundledMLX = String(cString: try XCTUnwrap(mlxVersion()))
        print("GuardTests: the bundled library runs on MLX \(bundledMLX); this program's MLX is "
              + "\(MLXKern.mlxSwiftMLXVersion)")
        XCTAssertNotEqual(bundledMLX, MLXKern.mlxSwiftMLXVersion)

        func assertNamesBoth(_ message: String, _ context: String) {
            XCTAssertTrue(message.contains(program), "\(context): names the program: \(message)")
            XCTAssertTrue(message.contains("libmlx.so"), "\(context): names the bundled libmlx: \(message)")
            print("GuardTests: \(context): \(message)")
        }

        // The bundled library: from an MLXArray, refused.
        var handle: OpaquePointer?
        XCTAssertEqual(fromMLX(UnsafeRawPointer(x.ctx.ctx), &handle), MLXKError.Status.unsupported.rawValue)
        XCTAssertNil(handle)
        assertNamesBoth(String(cString: try XCTUnwrap(lastError())), "bundled mlxk_array_from_mlx")

        // The bundled library: to an MLXArray, refused.
        let shape: [Int32] = [2, 2]
        XCTAssertEqual(shape.withUnsafeBufferPointer { zeros($0.baseAddress, 2, MLXKDType.float32.rawValue, &handle) }, 0)
        var out: UnsafeMutableRawPointer?
        XCTAssertEqual(toMLX(handle, &out), MLXKError.Status.unsupported.rawValue)
        XCTAssertNil(out)
        assertNamesBoth(String(cString: try XCTUnwrap(lastError())), "bundled mlxk_array_to_mlx")
        XCTAssertEqual(arrayFree(handle), 0)

        // This program's own (static) libmlxkern now sees the second MLX too.
        XCTAssertThrowsError(try MLXKArray(sharing: x)) { error in
            guard let error = error as? MLXKError else { return XCTFail("\(error)") }
            XCTAssertEqual(error.status, .unsupported)
            assertNamesBoth(error.message, "static MLXKArray(sharing:)")
        }
    }
}
