# bench_wakeup: thread wake-up and loopback TCP round-trip floors, no CAF
# (bench/wakeup.cpp), for reading bench_messaging's cross-process round trip.
add_executable(bench_wakeup ${CMAKE_CURRENT_LIST_DIR}/wakeup.cpp)
target_compile_options(bench_wakeup PRIVATE ${TROUPE_WARNINGS})
find_package(Threads REQUIRED)
target_link_libraries(bench_wakeup PRIVATE Threads::Threads)
