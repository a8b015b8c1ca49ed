import XCTest
import MLXKern

/// The GLM-5.2 expert-slot layout: the canonical table of docs/DESIGN.md §4 and the validator.
final class GLM52LayoutTests: XCTestCase {
    /// GLM-5: hidden 6144, intermediate 2048.
    private func glm5(bits: Int, groupSize: Int) throws -> GLM52Layout {
        try GLM52Layout.canonical(hidden: 6144, intermediate: 2048, bits: bits, groupSize: groupSize)
    }

    func testGLM5Q4Group64() throws {
        let layout = try glm5(bits: 4, groupSize: 64)
        XCTAssertEqual(layout, GLM52Layout(
            hiddenSize: 6144, intermediateSize: 2048, slotBytes: 20_054_016,
            downWeightOffset: 12_582_912, gateWeightOffset: 0, upWeightOffset: 6_291_456,
            downScaleOffset: 19_660_800, gateScaleOffset: 18_874_368, upScaleOffset: 19_267_584))
    }

    func testGLM5Q8Group64() throws {
        let layout = try glm5(bits: 8, groupSize: 64)
        XCTAssertEqual([layout.gateWeightOffset, layout.upWeightOffset, layout.downWeightOffset,
                        layout.gateScaleOffset, layout.upScaleOffset, layout.downScaleOffset],
                       [0, 12_582_912, 25_165_824, 37_748_736, 38_141_952, 38_535_168])
        XCTAssertEqual(layout.slotBytes, 38_928_384)
    }

    func testGLM5SlotSizesForEveryFormat() throws {
        let expected: [(bits: Int, groupSize: Int, slotBytes: UInt64)] = [
            (4, 32, 21_233_664), (4, 64, 20_054_016), (4, 128, 19_464_192),
            (8, 32, 40_108_032), (8, 64, 38_928_384), (8, 128, 38_338_560),
        ]
        for format in expected {
            let layout = try glm5(bits: format.bits, groupSize: format.groupSize)
            XCTAssertEqual(layout.slotBytes, format.slotBytes, "Q\(format.bits) g\(format.groupSize)")
            XCTAssertEqual(layout.slotBytes % GLM52Layout.slotAlignment, 0)
            for offset in [layout.gateWeightOffset, layout.upWeightOffset, layout.downWeightOffset,
                           layout.gateScaleOffset, layout.upScaleOffset, layout.downScaleOffset] {
                XCTAssertEqual(offset % GLM52Layout.slotAlignment, 0)
            }
            XCTAssertNoThrow(try layout.validate(bits: format.bits, groupSize: format.groupSize))
        }
        XCTAssertEqual(GLM52Layout.slotAlignment, 16384)
    }

    func testOverlappingRegionsAreRejected() throws {
        var layout = try glm5(bits: 4, groupSize: 64)
        layout.upScaleOffset = layout.downWeightOffset
        assertMLXKError(.invalidArgument, mentioning: "up scale overlaps down weight") {
            try layout.validate(bits: 4, groupSize: 64)
        }
    }

    func testOtherInvalidLayouts() throws {
        let canonical = try glm5(bits: 4, groupSize: 64)
        var layout = canonical
        layout.downScaleOffset += 8
        assertMLXKError(.invalidArgument, mentioning: "down scale offset is not 16-byte aligned") {
            try layout.validate(bits: 4, groupSize: 64)
        }
        layout = canonical
        layout.gateWeightOffset = layout.slotBytes - 16
        assertMLXKError(.invalidArgument, mentioning: "gate weight exceeds the canonical expert slot") {
            try layout.validate(bits: 4, groupSize: 64)
        }
        layout = canonical
        layout.slotBytes = 100
        assertMLXKError(.invalidArgument, mentioning: "slot bytes 100 must be a positive multiple of 16384") {
            try layout.validate(bits: 4, groupSize: 64)
        }
        layout = canonical
        layout.gateWeightOffset = 1 << 53
        assertMLXKError(.invalidArgument, mentioning: "exceeds 2^53-1") {
            try layout.validate(bits: 4, groupSize: 64)
        }
        // The Q4 layout is too small for Q8 weights.
        assertMLXKError(.invalidArgument, mentioning: "exceeds the canonical expert slot") {
            try canonical.validate(bits: 8, groupSize: 64)
        }
        // Regions may touch and need not be in canonical order: swap gate and up.
        layout = canonical
        (layout.gateWeightOffset, layout.upWeightOffset) = (layout.upWeightOffset, layout.gateWeightOffset)
        XCTAssertNoThrow(try layout.validate(bits: 4, groupSize: 64))
    }

    func testUnsupportedFormatsAreRejected() {
        assertMLXKError(.invalidArgument, mentioning: "bits is 5") {
            try GLM52Layout.canonical(hidden: 6144, intermediate: 2048, bits: 5, groupSize: 64)
        }
        assertMLXKError(.invalidArgument, mentioning: "group_size is 48") {
            try GLM52Layout.canonical(hidden: 6144, intermediate: 2048, bits: 4, groupSize: 48)
        }
        assertMLXKError(.invalidArgument, mentioning: "must be a positive multiple of group_size") {
            try GLM52Layout.canonical(hidden: 6144 + 32, intermediate: 2048, bits: 4, groupSize: 64)
        }
        assertMLXKError(.invalidArgument, mentioning: "bits is -4") {
            try GLM52Layout.canonical(hidden: 6144, intermediate: 2048, bits: -4, groupSize: 64)
        }
    }
}
