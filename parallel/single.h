// The `single` strategy: one rank runs every unit, in order, with no communication; its norm
// and update cover whole groups. It is the reference the other strategies are checked against.
#pragma once

#include "parallel/strategy.h"

namespace pv {

template <class T, class G>
class Single : public Strategy<T, G> {
  public:
    explicit Single(Llama<T>& model) : Strategy<T, G>(model, std::make_unique<Mesh>(nullptr, MeshShape{}, std::vector<MeshAxes>{})) {}
    bool sharded_optimizer() const override { return false; }

  protected:
    void finish_reduction() override {}
};

}  // namespace pv
