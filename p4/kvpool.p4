/* -*- P4_16 -*- */
/*
 * kvpool: a switch as an in-network KV-cache pool (v1model, BMv2 simple_switch_grpc).
 *
 * This file only includes and wires; each concern lives in include/ and p4/README.md
 * documents every table, action, register, counter and digest.
 */
#include <core.p4>
#include <v1model.p4>

#include "include/constants.p4"
#include "include/headers.p4"
#include "include/parser.p4"
#include "include/checksum.p4"
#include "include/safety.p4"
#include "include/forwarding.p4"
#include "include/pool.p4"
#include "include/popularity.p4"
#include "include/coalesce.p4"
#include "include/ingress.p4"
#include "include/egress.p4"
#include "include/deparser.p4"

V1Switch(
    MyParser(),
    MyVerifyChecksum(),
    MyIngress(),
    MyEgress(),
    MyComputeChecksum(),
    MyDeparser()
) main;
