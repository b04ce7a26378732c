// Placement of runtime actors on processes and devices (actors/placement.hpp):
// contiguous device blocks per process, actors follow their device, the
// coordinator on process 0, and bad counts rejected; [topology] interface
// given as a subnet.
#include <gtest/gtest.h>

#include <algorithm>
#include <stdexcept>

#include "actors/cluster/interface_address.hpp"
#include "actors/placement.hpp"

using troupe::runtime::make_placement;

TEST(Placement, DevicesSplitInContiguousBlocks) {
  const auto p = make_placement(5, 2, 1, 1, 1);
  EXPECT_EQ(p.device_process, (std::vector<int>{0, 0, 0, 1, 1}));
  const auto q = make_placement(4, 4, 1, 1, 1);
  EXPECT_EQ(q.device_process, (std::vector<int>{0, 1, 2, 3}));
}

TEST(Placement, ActorsFollowTheirDevice) {
  // 2 stages x 2 replicas on 4 devices, 3 shards, 2 processes.
  const auto p = make_placement(4, 2, 2, 2, 3);
  EXPECT_EQ(p.rank_device[0], (std::vector<int>{0, 1}));
  EXPECT_EQ(p.rank_device[1], (std::vector<int>{2, 3}));
  EXPECT_EQ(p.shard_device, (std::vector<int>{0, 1, 2}));
  EXPECT_EQ(p.rank_process(1, 0), 1);
  EXPECT_EQ(p.shard_process(2), 1);
  EXPECT_EQ(p.actors_on(0), (std::vector<std::string>{"coordinator", "optimizer:0", "optimizer:1", "stage:0/replica:0",
                                                       "stage:1/replica:0"}));
  EXPECT_EQ(p.actors_on(1), (std::vector<std::string>{"optimizer:2", "stage:0/replica:1", "stage:1/replica:1"}));
}

TEST(Placement, OneProcessHoldsEverything) {
  const auto p = make_placement(3, 1, 3, 1, 2);
  EXPECT_EQ(p.actors_on(0).size(), 6u);  // coordinator, 2 shards, 3 ranks
  EXPECT_TRUE(p.actors_on(1).empty());
}

TEST(Placement, BadCountsAreRejected) {
  EXPECT_THROW(make_placement(2, 3, 1, 1, 1), std::invalid_argument);  // more processes than devices
  EXPECT_THROW(make_placement(2, 0, 1, 1, 1), std::invalid_argument);
  EXPECT_THROW(make_placement(0, 1, 1, 1, 1), std::invalid_argument);
  EXPECT_THROW(make_placement(2, 1, 1, 1, 0), std::invalid_argument);
}

TEST(Placement, ExplicitDeviceProcesses) {
  // Device 0 on process 1, device 1 on process 0: actors follow their device,
  // the coordinator stays on process 0.
  const auto p = make_placement(2, 2, 2, 1, 2, {1, 0});
  EXPECT_EQ(p.actors_on(0), (std::vector<std::string>{"coordinator", "optimizer:1", "stage:1"}));
  EXPECT_EQ(p.actors_on(1), (std::vector<std::string>{"optimizer:0", "stage:0"}));
  EXPECT_THROW(make_placement(2, 2, 2, 1, 1, {0}), std::invalid_argument);     // wrong length
  EXPECT_THROW(make_placement(2, 2, 2, 1, 1, {0, 2}), std::invalid_argument);  // out of range
  EXPECT_THROW(make_placement(2, 2, 2, 1, 1, {1, 1}), std::invalid_argument);  // process 0 without a device
}

TEST(Placement, ExpertShardsStartAtTheirLayersRank) {
  // 2 stages x 2 replicas on 4 devices, 2 processes; layers 0,1 on rank 0 and
  // 2,3 on rank 1; 2 expert shards per layer: shard k on (rank's device + k).
  auto p = make_placement(4, 2, 2, 2, 1);
  troupe::runtime::place_experts(p, {0, 1, 2, 3}, {0, 0, 1, 1}, 2);
  ASSERT_EQ(p.expert_ids.size(), 8u);
  EXPECT_EQ(p.expert_ids[5], (std::pair<int, int>{2, 1}));
  EXPECT_EQ(p.expert_device[0], (std::vector<int>{0, 1, 0, 1, 1, 2, 1, 2}));
  EXPECT_EQ(p.expert_device[1], (std::vector<int>{2, 3, 2, 3, 3, 0, 3, 0}));
  EXPECT_EQ(p.expert_process(0, 5), 1);  // device 2
  EXPECT_EQ(p.expert_process(1, 7), 0);  // device 0
  const auto on0 = p.actors_on(0);
  EXPECT_NE(std::find(on0.begin(), on0.end(), "expert:3/1/replica:1"), on0.end());
  EXPECT_EQ(std::count_if(on0.begin(), on0.end(), [](const std::string& n) { return n.rfind("expert:", 0) == 0; }), 8);
  EXPECT_THROW(troupe::runtime::place_experts(p, {0, 1}, {0}, 2), std::invalid_argument);
  EXPECT_THROW(troupe::runtime::place_experts(p, {0}, {2}, 2), std::invalid_argument);  // no rank 2
}

// [topology] interface as a subnet (actors/cluster/interface_address.hpp):
// each process binds to its own address in it.
TEST(InterfaceSubnet, ResolvesToThisHostsAddressInTheSubnet) {
  using troupe::runtime::resolve_interface;
  EXPECT_EQ(resolve_interface("127.0.0.0/8"), "127.0.0.1");  // loopback is on every host
  EXPECT_EQ(resolve_interface("127.0.0.1/32"), "127.0.0.1");
  // Literal addresses pass through unchanged.
  EXPECT_EQ(resolve_interface("127.0.0.1"), "127.0.0.1");
  EXPECT_EQ(resolve_interface("0.0.0.0"), "0.0.0.0");
  // 0.0.0.1 is no host's address (0.0.0.0/8 is "this network", RFC 1122).
  try {
    resolve_interface("0.0.0.1/32");
    ADD_FAILURE() << "a subnet this host is not on resolved";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("no IPv4 address in that subnet (it has: "), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("127.0.0.1 (lo)"), std::string::npos) << e.what();
  }
}

TEST(InterfaceSubnet, MalformedSubnetsAreNamed) {
  using troupe::runtime::interface_subnet_error;
  EXPECT_EQ(interface_subnet_error("10.77.0.0/24"), "");
  EXPECT_EQ(interface_subnet_error("127.0.0.1"), "");  // not a subnet: a literal address
  EXPECT_NE(interface_subnet_error("10.77.0.0/33").find("the prefix length '33' must be 1..32"), std::string::npos);
  EXPECT_NE(interface_subnet_error("10.77.0.0/").find("the prefix length '' must be 1..32"), std::string::npos);
  EXPECT_NE(interface_subnet_error("10.77.0/24").find("'10.77.0' is not an IPv4 address"), std::string::npos);
  EXPECT_NE(interface_subnet_error("10.77.0.0/2x").find("must be 1..32"), std::string::npos);
  EXPECT_THROW(troupe::runtime::resolve_interface("host/24"), std::runtime_error);
}
