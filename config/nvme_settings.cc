#include "strata/config/nvme_settings.h"

namespace strata {

IoSettingNames io_setting_names() {
  IoSettingNames names;
  names.engine = "STRATA_IO_ENGINE";
  names.depth = "STRATA_IO_DEPTH";
  names.stripe = "STRATA_IO_BLOCK";
  names.bytes_per_path = "STRATA_NVME_BYTES";
  names.paths = "STRATA_NVME_PATHS";
  return names;
}

}  // namespace strata
