// The attention launchers' one compiled copy (kernels/attention_instances.h says why): every
// explicit instantiation that header declares.
#include "kernels/attention_instances.h"

namespace pv {

POLEVAULT_ATTENTION_INSTANCES()

}  // namespace pv
