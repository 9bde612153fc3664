// Reads the convolution attributes shared by all BigConv2D* ops. Works on
// both OpKernelConstruction and shape InferenceContext (same GetAttr API).
#pragma once

#include <string>
#include <vector>

#include "cost_model.h"
#include "geometry.h"
#include "tensorflow/core/framework/op_kernel.h"

namespace tfbigconv {

template <typename Ctx>
absl::Status GetConvAttrs(Ctx* c, ConvAttrs* a) {
  std::vector<int32_t> strides, dilations;
  std::vector<int64_t> explicit_paddings;
  std::string padding, data_format;
  TF_RETURN_IF_ERROR(c->GetAttr("strides", &strides));
  TF_RETURN_IF_ERROR(c->GetAttr("dilations", &dilations));
  TF_RETURN_IF_ERROR(c->GetAttr("padding", &padding));
  TF_RETURN_IF_ERROR(c->GetAttr("explicit_paddings", &explicit_paddings));
  TF_RETURN_IF_ERROR(c->GetAttr("data_format", &data_format));
  std::string err = ParsePadding(padding, &a->padding);
  if (err.empty()) err = ParseDataFormat(data_format, &a->data_format);
  if (!err.empty()) return tensorflow::errors::InvalidArgument(err);
  a->strides.assign(strides.begin(), strides.end());
  a->dilations.assign(dilations.begin(), dilations.end());
  a->explicit_paddings = explicit_paddings;
  err = ValidateAttrs(*a);
  if (!err.empty()) return tensorflow::errors::InvalidArgument(err);
  return absl::OkStatus();
}

// The ops' algorithm attributes as the core's enum: the one place the op
// library reads their strings. planned_algorithm's "none" (no trace-time
// plan) reads as kAuto.
template <typename Ctx>
absl::Status GetAlgorithmAttrs(Ctx* c, AlgorithmRequest* algorithm, AlgorithmRequest* planned) {
  std::string name, planned_name;
  TF_RETURN_IF_ERROR(c->GetAttr("algorithm", &name));
  TF_RETURN_IF_ERROR(c->GetAttr("planned_algorithm", &planned_name));
  std::string err = ParseAlgorithmRequest(name, algorithm);
  *planned = AlgorithmRequest::kAuto;
  if (err.empty() && planned_name != "none") err = ParseAlgorithmRequest(planned_name, planned);
  if (!err.empty()) return tensorflow::errors::InvalidArgument(err);
  return absl::OkStatus();
}

}  // namespace tfbigconv
