# warren_microvm_probe: whether /dev/kvm runs a stock guest (kvm_probe.{h,cc}),
# a library of its own so that the microvm backend and the daemon's status can
# link it. Included from the top-level CMakeLists.txt after the components
# and the tests' set-up (GTest found), or from src/runtime/microvm/CMakeLists.txt.
if(NOT TARGET warren_microvm_probe)
  add_library(warren_microvm_probe STATIC ${CMAKE_CURRENT_LIST_DIR}/kvm_probe.cc)
  target_link_libraries(warren_microvm_probe PUBLIC warren_common warren_jail)
  if(WARREN_BUILD_TESTS)
    add_executable(kvm_probe_test ${CMAKE_SOURCE_DIR}/tests/unit/microvm/kvm_probe_test.cc)
    target_link_libraries(kvm_probe_test PRIVATE warren_microvm_probe GTest::gtest GTest::gmock GTest::gtest_main)
    gtest_discover_tests(kvm_probe_test DISCOVERY_TIMEOUT 30 PROPERTIES TIMEOUT 60)
  endif()
endif()
