// Keeps large freed blocks in the process (glibc mallopt): the runtime and
// decoupled RL free and allocate ~14 MB buffers every step, which glibc's
// defaults hand back to the kernel and page-fault in again. The measured
// reasons are at the definition (actors/supervision/runtime.cpp).
#pragma once

namespace troupe::runtime {

// Process-wide; call before the threads that allocate start.
void keep_freed_memory();

}  // namespace troupe::runtime
