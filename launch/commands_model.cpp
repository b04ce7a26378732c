// `troupe eval`, `troupe sample`, `troupe export`, `troupe import`: commands
// that work on a checkpoint with the model library.
#include "launch/cli.hpp"
