// The tests' precompiled header (core/precompiled.h's, GoogleTest and <random>): see there.
#pragma once
#include <gtest/gtest.h>

#include <random>

#include "core/precompiled.h"
