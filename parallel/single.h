// The `single` strategy: one rank runs every unit, in order, with no communication; its norm
// and update cover whole groups. It is the reference the other strategies are checked against.
#pragma once

#include "parallel/strategy.h"

namespace pv {

template <class T, class G>
class Single : public Strategy<T, G> {
  public:
    explicit Single(Llama<T>& model) : Strategy<T, G>(model, nullptr) {}
    const char* name() const override { return "single"; }
    bool sharded_optimizer() const override { return false; }
    void finish_gradients() override {}
};

}  // namespace pv
