// Entry point of the `troupe` executable.
#include "launch/cli.hpp"

int main(int argc, char** argv) { return troupe::launch::run_cli(argc, argv); }
