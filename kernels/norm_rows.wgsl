// norm_rows: the row placement and reduction shared by the norm kernels (rms_norm.wgsl,
// layer_norm.wgsl), prepended to both by kernels/rms_norm.ts (normShapePrelude) after the shape
// constants ROW_THREADS and ROWS_PER_WG (powers of two): each of the workgroup's ROWS_PER_WG rows
// gets ROW_THREADS invocations (lanes), invocation lid = local_row * ROW_THREADS + lane.
// Bindings: none. Workgroup memory: partial [ROW_THREADS * ROWS_PER_WG] f32 (one per
// invocation), row_value [ROWS_PER_WG] f32 (one per row).

var<workgroup> partial: array<f32, ROW_THREADS * ROWS_PER_WG>;
var<workgroup> row_value: array<f32, ROWS_PER_WG>;

// Where an invocation works: lid = local_row * ROW_THREADS + lane; row is the global row, past
// the last one for the idle lanes of the last workgroup (which must not return early: every
// invocation has to reach the barriers).
struct RowLane {
  lid: u32,
  local_row: u32,
  lane: u32,
  row: u32,
}

fn row_lane(wid: vec3u, nwg: vec3u, lid: u32) -> RowLane {
  let local_row = lid / ROW_THREADS;
  let row = (wid.x + wid.y * nwg.x) * ROWS_PER_WG + local_row;
  return RowLane(lid, local_row, lid - local_row * ROW_THREADS, row);
}

// Sum over the ROW_THREADS lanes of one row, returned to all of them: lane 0 adds the partials
// (O(ROW_THREADS), where every lane summing would be O(ROW_THREADS^2), slow on CPU adapters).
// Must be called in uniform control flow (two barriers); with ROW_THREADS = 1 it is the
// identity. A second call must be preceded by row_barrier().
fn row_sum(v: f32, at: RowLane) -> f32 {
  if (ROW_THREADS == 1u) {
    return v;
  }
  partial[at.lid] = v;
  workgroupBarrier();
  if (at.lane == 0u) {
    var total = 0.0;
    for (var j = 0u; j < ROW_THREADS; j++) {
      total += partial[at.lid + j];
    }
    row_value[at.local_row] = total;
  }
  workgroupBarrier();
  return row_value[at.local_row];
}

// Between two row_sum calls: the next one overwrites partial / row_value, so wait until every
// lane has read them (no-op with ROW_THREADS = 1).
fn row_barrier() {
  if (ROW_THREADS > 1u) {
    workgroupBarrier();
  }
}
