// kv_fp8_e4m3: the float8_e4m3fn codes of an 8-bit KV cache (vLLM's `--kv-cache-dtype fp8`),
// four per u32: element 4i + j of the flat cache [num_blocks, num_kv_heads, block_size,
// head_dim] is byte j (bits 8j .. 8j + 7) of word i, so the buffer's bytes are the elements in
// order. No bindings, no entry point: prepended to the KV writers and readers by
// kernels/kv_codec.ts.
//   code: sign s (bit 7), exponent e (bits 3-6, bias 7), mantissa m (bits 0-2);
//   value = (-1)^s 2^(e - 7) (1 + m / 8) for e > 0, (-1)^s 2^-6 m / 8 for e = 0.
//   0x7F and 0xFF are NaN (read as NaN; never written).
// Encoding rounds to nearest, ties to even, saturates at +-448 (the largest finite value) and
// keeps the sign bit (-0 is 0x80); a NaN input's code is unspecified. The scale is 1: values are
// stored as they are, as vLLM does without calibrated K/V scales.

// The codes of v's four values, x in byte 0 .. w in byte 3.
fn e4m3_pack4(v: vec4<f32>) -> u32 {
  let a = min(abs(v), vec4<f32>(448.0));
  let b = bitcast<vec4<u32>>(a);
  // a >= 2^-6: the f32 exponent and the top 3 mantissa bits, rounded to nearest even (a carry
  // moves into the exponent), the exponent rebased from bias 127 to 7 (120 << 3).
  let rounded = (b + vec4<u32>(0x7FFFFu) + ((b >> vec4<u32>(20u)) & vec4<u32>(1u))) >>
    vec4<u32>(20u);
  let normal = rounded - vec4<u32>(960u);
  // a < 2^-6: a multiple of 2^-9 (round is to nearest even; 8 is the code of 2^-6).
  let sub = vec4<u32>(round(a * 512.0));
  let mag = select(normal, sub, a < vec4<f32>(0.015625));
  let c = mag | ((bitcast<vec4<u32>>(v) >> vec4<u32>(31u)) << vec4<u32>(7u));
  return c.x | (c.y << 8u) | (c.z << 16u) | (c.w << 24u);
}

// The four values whose codes w holds (byte 0 in x); NaN for the codes 0x7F and 0xFF.
fn e4m3_unpack4(w: u32) -> vec4<f32> {
  let c = (vec4<u32>(w) >> vec4<u32>(0u, 8u, 16u, 24u)) & vec4<u32>(0xFFu);
  let sign = (c & vec4<u32>(0x80u)) << vec4<u32>(24u);
  // e > 0: exponent and mantissa moved into the f32 fields, the bias raised by 120.
  let normal = bitcast<vec4<f32>>((((c & vec4<u32>(0x7Fu)) << vec4<u32>(20u)) +
    vec4<u32>(0x3C000000u)) | sign);
  // e = 0: m 2^-9.
  let sub = bitcast<vec4<f32>>(
    bitcast<vec4<u32>>(vec4<f32>(c & vec4<u32>(7u)) * (1.0 / 512.0)) | sign,
  );
  let value = select(normal, sub, (c & vec4<u32>(0x78u)) == vec4<u32>(0u));
  return select(value, bitcast<vec4<f32>>(vec4<u32>(0x7FC00000u)), (c & vec4<u32>(0x7Fu)) ==
    vec4<u32>(0x7Fu));
}
