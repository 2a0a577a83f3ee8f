/* dtype.c - sizes and names of the element types and reductions. */
#include <stddef.h>

#include "mep/mep.h"

size_t mep_dtype_size(mep_dtype_t dtype) {
  switch (dtype) {
  case MEP_FLOAT16:
  case MEP_BFLOAT16: return 2;
  case MEP_FLOAT32:
  case MEP_INT32: return 4;
  case MEP_FLOAT64:
  case MEP_INT64: return 8;
  case MEP_INT8:
  case MEP_UINT8:
  case MEP_BOOL: return 1;
  }
  return 0;
}

const char *mep_dtype_name(mep_dtype_t dtype) {
  switch (dtype) {
  case MEP_FLOAT16: return "float16";
  case MEP_BFLOAT16: return "bfloat16";
  case MEP_FLOAT32: return "float32";
  case MEP_FLOAT64: return "float64";
  case MEP_INT8: return "int8";
  case MEP_UINT8: return "uint8";
  case MEP_INT32: return "int32";
  case MEP_INT64: return "int64";
  case MEP_BOOL: return "bool";
  }
  return NULL;
}

const char *mep_op_name(mep_op_t op) {
  switch (op) {
  case MEP_SUM: return "sum";
  case MEP_PROD: return "prod";
  case MEP_MIN: return "min";
  case MEP_MAX: return "max";
  case MEP_AVG: return "avg";
  }
  return NULL;
}
