// Test hooks of ZeroEngine (not installed).
#pragma once

namespace strata::testing {

// Engines created while this is on move Gloo's data through pinned bounce buffers, as they do
// on a CUDA device, also on the host backend (whose GPU tier Gloo could read directly): the
// bounce path's copies, flags and ordering run in every test environment. Process-wide; set it
// the same way on every rank of a job.
void set_zero_bounce_for_testing(bool on);

}  // namespace strata::testing
