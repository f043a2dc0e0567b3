/* -*- P4_16 -*- */
/*
 * kvpool data plane for Tofino 1 (TNA), one pipe: includes and wiring only, as
 * ../kvpool.p4 is for v1model.  Wire format, constants, drop reasons and statistics come
 * from ../include/ (shared); the geometry from geometry.p4; README.md in p4/ says what
 * differs from the v1model program and why.
 */
#include <core.p4>
#include <tna.p4>

#include "geometry.p4"
#include "../include/constants.p4"
#include "headers.p4"
#include "parser.p4"
#include "safety.p4"
#include "pool.p4"
#include "popularity.p4"
#include "coalesce.p4"
#include "forwarding.p4"
#include "ingress.p4"
#include "egress.p4"

Pipeline(MyIngressParser(),
         MyIngress(),
         MyIngressDeparser(),
         MyEgressParser(),
         MyEgress(),
         MyEgressDeparser()) pipe;

Switch(pipe) main;
