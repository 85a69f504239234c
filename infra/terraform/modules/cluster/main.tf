# Cluster: EKS with one CPU node group for the platform and, unless Karpenter provisions the
# GPU nodes (var.gpu_provisioner, modules/karpenter), one tainted node group per GPU pool; the
# NVIDIA device plugin and pinned add-ons. The VPC CNI enforces NetworkPolicies.

locals {
  gpu_taint = {
    key    = "nvidia.com/gpu"
    value  = "true"
    effect = "NO_SCHEDULE"
  }

  gpu_groups = {
    for name, g in var.gpu_node_groups : "gpu-${name}" => {
      ami_type       = "AL2023_x86_64_NVIDIA"
      instance_types = g.instance_types
      capacity_type  = g.capacity_type
      min_size       = g.min_size
      max_size       = g.max_size
      desired_size   = g.desired_size
      labels         = { "loraplex.dev/gpu-pool" = name, "loraplex.dev/pool" = "gpu" }
      taints         = { gpu = local.gpu_taint }
      # A capacity block runs on its reservation only: EC2 needs the market type and the target.
      instance_market_options = g.capacity_type == "CAPACITY_BLOCK" ? { market_type = "capacity-block" } : null
      capacity_reservation_specification = g.capacity_type == "CAPACITY_BLOCK" ? {
        capacity_reservation_target = { capacity_reservation_id = g.capacity_reservation_id }
      } : null
      block_device_mappings = {
        xvda = {
          device_name = "/dev/xvda"
          ebs = {
            volume_size           = g.disk_size_gb
            volume_type           = "gp3"
            encrypted             = true
            delete_on_termination = true
          }
        }
      }
    }
  }

  # Cluster Autoscaler reads these tags to scale a GPU pool up from zero nodes: it must know
  # the labels, taint and GPU count a node would have before one exists.
  gpu_asg_tags = merge([
    for name, g in(var.gpu_provisioner == "node_groups" ? var.gpu_node_groups : {}) : {
      "${name}/label"    = { pool = name, key = "k8s.io/cluster-autoscaler/node-template/label/loraplex.dev/gpu-pool", value = name }
      "${name}/taint"    = { pool = name, key = "k8s.io/cluster-autoscaler/node-template/taint/nvidia.com/gpu", value = "true:NoSchedule" }
      "${name}/gpus"     = { pool = name, key = "k8s.io/cluster-autoscaler/node-template/resources/nvidia.com/gpu", value = tostring(g.gpus_per_node) }
      "${name}/owned"    = { pool = name, key = "k8s.io/cluster-autoscaler/${var.name}", value = "owned" }
      "${name}/autoscal" = { pool = name, key = "k8s.io/cluster-autoscaler/enabled", value = "true" }
    }
  ]...)
}

module "ebs_csi_irsa" {
  #checkov:skip=CKV_TF_1:A registry module pinned to an exact version; registry sources cannot name a commit hash.
  source  = "terraform-aws-modules/iam/aws//modules/iam-role-for-service-accounts-eks"
  version = "5.60.0"

  role_name             = "${var.name}-ebs-csi"
  attach_ebs_csi_policy = true

  oidc_providers = {
    main = {
      provider_arn               = module.eks.oidc_provider_arn
      namespace_service_accounts = ["kube-system:ebs-csi-controller-sa"]
    }
  }

  tags = var.tags
}

module "eks" {
  #checkov:skip=CKV_TF_1:A registry module pinned to an exact version; registry sources cannot name a commit hash.
  source  = "terraform-aws-modules/eks/aws"
  version = "20.37.1"

  cluster_name    = var.name
  cluster_version = var.kubernetes_version

  cluster_endpoint_private_access      = true
  cluster_endpoint_public_access       = length(var.endpoint_public_access_cidrs) > 0
  cluster_endpoint_public_access_cidrs = var.endpoint_public_access_cidrs

  authentication_mode                      = "API"
  enable_cluster_creator_admin_permissions = true
  enable_irsa                              = true

  vpc_id     = var.vpc_id
  subnet_ids = var.private_subnet_ids

  # Karpenter finds the security group of the nodes it launches by this tag.
  node_security_group_tags = { "karpenter.sh/discovery" = var.name }

  cluster_enabled_log_types              = ["api", "audit", "authenticator", "controllerManager", "scheduler"]
  cloudwatch_log_group_retention_in_days = var.log_retention_days

  cluster_addons = {
    coredns = {
      addon_version = var.addon_versions["coredns"]
    }
    kube-proxy = {
      addon_version = var.addon_versions["kube-proxy"]
    }
    vpc-cni = {
      addon_version  = var.addon_versions["vpc-cni"]
      before_compute = true
      # NetworkPolicies are enforced by the VPC CNI's network policy agent.
      configuration_values = jsonencode({ enableNetworkPolicy = "true" })
    }
    aws-ebs-csi-driver = {
      addon_version            = var.addon_versions["aws-ebs-csi-driver"]
      service_account_role_arn = module.ebs_csi_irsa.iam_role_arn
    }
    # Mounts the weights cache (EFS) on the nodes. Its volume is provisioned statically (a
    # PersistentVolume naming the file system), so the controller needs no AWS role.
    aws-efs-csi-driver = {
      addon_version = var.addon_versions["aws-efs-csi-driver"]
    }
  }

  eks_managed_node_groups = merge(
    {
      platform = {
        ami_type       = "AL2023_x86_64_STANDARD"
        instance_types = var.platform_node_group.instance_types
        min_size       = var.platform_node_group.min_size
        max_size       = var.platform_node_group.max_size
        desired_size   = var.platform_node_group.desired_size
        labels         = { "loraplex.dev/pool" = "platform" }
        block_device_mappings = {
          xvda = {
            device_name = "/dev/xvda"
            ebs = {
              volume_size           = var.platform_node_group.disk_size_gb
              volume_type           = "gp3"
              encrypted             = true
              delete_on_termination = true
            }
          }
        }
      }
    },
    var.gpu_provisioner == "node_groups" ? local.gpu_groups : {},
  )

  tags = var.tags
}

resource "aws_autoscaling_group_tag" "gpu_scale_from_zero" {
  for_each = local.gpu_asg_tags

  autoscaling_group_name = module.eks.eks_managed_node_groups["gpu-${each.value.pool}"].node_group_autoscaling_group_names[0]

  tag {
    key                 = each.value.key
    value               = each.value.value
    propagate_at_launch = false
  }
}

resource "helm_release" "nvidia_device_plugin" {
  name       = "nvidia-device-plugin"
  repository = "https://nvidia.github.io/k8s-device-plugin"
  chart      = "nvidia-device-plugin"
  version    = var.device_plugin_chart_version
  namespace  = "kube-system"

  values = [yamlencode({
    nodeSelector = { "loraplex.dev/pool" = "gpu" }
    tolerations  = [{ key = "nvidia.com/gpu", operator = "Exists", effect = "NoSchedule" }]
    # The EKS NVIDIA AMI ships the driver and container toolkit; no GPU feature discovery.
    gfd = { enabled = false }
    nfd = { enabled = false }
  })]

  depends_on = [module.eks]
}
