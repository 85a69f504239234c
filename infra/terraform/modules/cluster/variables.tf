variable "name" {
  description = "EKS cluster name."
  type        = string

  validation {
    condition     = can(regex("^[a-z][a-z0-9-]{2,30}$", var.name))
    error_message = "name must be 3-31 characters of lowercase letters, digits and dashes, starting with a letter."
  }
}

variable "kubernetes_version" {
  description = "Kubernetes <major>.<minor> of the control plane and the node groups; the add-on versions must match it."
  type        = string

  validation {
    condition     = can(regex("^1\\.(3[2-9])$", var.kubernetes_version))
    error_message = "kubernetes_version must be 1.32 or newer, as <major>.<minor>."
  }
}

variable "vpc_id" {
  description = "VPC the cluster lives in."
  type        = string

  validation {
    condition     = can(regex("^vpc-[0-9a-f]+$", var.vpc_id))
    error_message = "vpc_id must be a VPC ID (vpc-...)."
  }
}

variable "private_subnet_ids" {
  description = "Private subnets for the control plane ENIs and every node group (three zones)."
  type        = list(string)

  validation {
    condition     = length(var.private_subnet_ids) >= 2
    error_message = "EKS needs subnets in at least two zones."
  }
}

variable "endpoint_public_access_cidrs" {
  description = "CIDRs allowed to reach the public Kubernetes API endpoint; empty keeps the endpoint private (reach it over VPN or a bastion)."
  type        = list(string)

  validation {
    condition     = alltrue([for c in var.endpoint_public_access_cidrs : can(cidrhost(c, 0)) && c != "0.0.0.0/0"])
    error_message = "endpoint_public_access_cidrs must be valid CIDRs, and not 0.0.0.0/0."
  }
}

variable "platform_node_group" {
  description = "CPU node group for api, worker, console and the cluster add-ons."
  type = object({
    instance_types = list(string)
    min_size       = number
    max_size       = number
    desired_size   = number
    disk_size_gb   = number
  })

  validation {
    condition = (
      var.platform_node_group.min_size >= 1 &&
      var.platform_node_group.min_size <= var.platform_node_group.desired_size &&
      var.platform_node_group.desired_size <= var.platform_node_group.max_size &&
      var.platform_node_group.disk_size_gb >= 20
    )
    error_message = "platform_node_group needs 1 <= min_size <= desired_size <= max_size and disk_size_gb >= 20."
  }
}

variable "gpu_node_groups" {
  description = "GPU pools by name (the name becomes the node label loraplex.dev/gpu-pool that engine pods select). Nodes are tainted nvidia.com/gpu=true:NoSchedule; min_size 0 lets a pool scale from zero."
  type = map(object({
    instance_types = list(string)
    gpus_per_node  = number
    min_size       = number
    max_size       = number
    desired_size   = number
    capacity_type  = string
    disk_size_gb   = number
    # The reservation a CAPACITY_BLOCK pool runs on (cr-...); empty for the other types.
    capacity_reservation_id = optional(string, "")
  }))

  validation {
    condition = alltrue(flatten([
      for g in values(var.gpu_node_groups) : [
        for t in g.instance_types : can(regex("^(p5|p5e|p5en|p4d|p4de|g6e|g6|g5)\\.[0-9]*x?large$", t))
      ]
    ]))
    error_message = "GPU instance types must be of the H100/H200 (p5, p5e, p5en), A100 (p4d, p4de), L40S (g6e), L4 (g6) or A10G (g5) families."
  }

  validation {
    condition = alltrue([
      for g in values(var.gpu_node_groups) :
      contains([1, 2, 4, 8], g.gpus_per_node) && g.min_size >= 0 && g.min_size <= g.desired_size && g.desired_size <= g.max_size && g.disk_size_gb >= 100 && contains(["ON_DEMAND", "SPOT", "CAPACITY_BLOCK"], g.capacity_type)
    ])
    error_message = "Each GPU pool needs gpus_per_node in 1/2/4/8, 0 <= min_size <= desired_size <= max_size, disk_size_gb >= 100 and capacity_type ON_DEMAND, SPOT or CAPACITY_BLOCK."
  }

  validation {
    condition     = alltrue([for k in keys(var.gpu_node_groups) : can(regex("^[a-z][a-z0-9-]{1,20}$", k))])
    error_message = "GPU pool names must be 2-21 characters of lowercase letters, digits and dashes."
  }

  validation {
    condition = alltrue([
      for g in values(var.gpu_node_groups) :
      (g.capacity_type == "CAPACITY_BLOCK") == can(regex("^cr-[0-9a-f]{8,17}$", g.capacity_reservation_id))
    ])
    error_message = "A CAPACITY_BLOCK pool needs capacity_reservation_id (cr-...) of its capacity block; other pools must leave it empty."
  }
}

variable "addon_versions" {
  description = "Pinned EKS add-on versions (coredns, kube-proxy, vpc-cni, aws-ebs-csi-driver, aws-efs-csi-driver); `aws eks describe-addon-versions --kubernetes-version X` lists those that match the cluster."
  type        = map(string)

  validation {
    condition = (
      length(setsubtract(["coredns", "kube-proxy", "vpc-cni", "aws-ebs-csi-driver", "aws-efs-csi-driver"], keys(var.addon_versions))) == 0 &&
      alltrue([for v in values(var.addon_versions) : can(regex("^v[0-9]+\\.[0-9]+\\.[0-9]+-eksbuild\\.[0-9]+$", v))])
    )
    error_message = "addon_versions needs coredns, kube-proxy, vpc-cni, aws-ebs-csi-driver and aws-efs-csi-driver, each as vX.Y.Z-eksbuild.N."
  }
}

variable "device_plugin_chart_version" {
  description = "Pinned version of NVIDIA's k8s-device-plugin Helm chart (advertises nvidia.com/gpu on GPU nodes)."
  type        = string

  validation {
    condition     = can(regex("^[0-9]+\\.[0-9]+\\.[0-9]+$", var.device_plugin_chart_version))
    error_message = "device_plugin_chart_version must be an exact X.Y.Z version."
  }
}

variable "log_retention_days" {
  description = "Days to keep the control-plane logs."
  type        = number

  validation {
    condition     = contains([1, 3, 5, 7, 14, 30, 60, 90, 120, 150, 180, 365, 400, 545, 731, 1096, 1827, 2192, 2557, 2922, 3288, 3653], var.log_retention_days)
    error_message = "log_retention_days must be a retention CloudWatch accepts (1, 3, 5, 7, 14, 30, 60, 90, ...)."
  }
}

variable "tags" {
  description = "Tags added to every resource."
  type        = map(string)

  validation {
    condition     = alltrue([for k, v in var.tags : length(k) > 0 && length(k) <= 128 && length(v) <= 256])
    error_message = "tags need keys of 1-128 and values of at most 256 characters (AWS limits)."
  }
}

variable "gpu_provisioner" {
  description = "What makes the GPU nodes: \"node_groups\" (a managed node group per pool, the Cluster Autoscaler) or \"karpenter\" (a NodePool per pool, modules/karpenter)."
  type        = string

  validation {
    condition     = contains(["node_groups", "karpenter"], var.gpu_provisioner)
    error_message = "gpu_provisioner must be node_groups or karpenter."
  }

  validation {
    condition     = var.gpu_provisioner == "node_groups" || alltrue([for g in values(var.gpu_node_groups) : g.capacity_type != "CAPACITY_BLOCK"])
    error_message = "A CAPACITY_BLOCK pool runs on a managed node group: use gpu_provisioner = \"node_groups\" with capacity blocks."
  }
}
