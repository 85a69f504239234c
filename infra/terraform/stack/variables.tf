variable "environment" {
  description = "Environment name; prefixes every resource (loraplex-<environment>)."
  type        = string

  validation {
    condition     = can(regex("^[a-z][a-z0-9]{1,11}$", var.environment))
    error_message = "environment must be 2-12 lowercase letters and digits, e.g. dev or prod."
  }
}

variable "region" {
  description = "AWS region of the whole platform."
  type        = string

  validation {
    condition     = can(regex("^[a-z]{2}(-[a-z]+)+-[0-9]$", var.region))
    error_message = "region must look like us-east-1."
  }
}

variable "namespace" {
  description = "Kubernetes namespace of the platform's workloads."
  type        = string

  validation {
    condition     = can(regex("^[a-z0-9]([-a-z0-9]*[a-z0-9])?$", var.namespace)) && length(var.namespace) <= 63
    error_message = "namespace must be a valid Kubernetes namespace name."
  }
}

variable "vpc_cidr" {
  description = "IPv4 /16 of the VPC."
  type        = string

  validation {
    condition     = can(cidrhost(var.vpc_cidr, 0)) && tonumber(split("/", var.vpc_cidr)[1]) == 16
    error_message = "vpc_cidr must be a valid IPv4 /16."
  }
}

variable "single_nat_gateway" {
  description = "One NAT gateway for all zones (dev) instead of one per zone (prod)."
  type        = bool
}

variable "kubernetes_version" {
  description = "Kubernetes <major>.<minor> of the cluster (the manifests are validated against it)."
  type        = string

  validation {
    condition     = can(regex("^1\\.(3[2-9])$", var.kubernetes_version))
    error_message = "kubernetes_version must be 1.32 or newer, as <major>.<minor>."
  }
}

variable "endpoint_public_access_cidrs" {
  description = "CIDRs allowed to reach the Kubernetes API endpoint; empty keeps it private."
  type        = list(string)

  validation {
    condition     = alltrue([for c in var.endpoint_public_access_cidrs : can(cidrhost(c, 0)) && c != "0.0.0.0/0"])
    error_message = "endpoint_public_access_cidrs must be valid CIDRs, and not 0.0.0.0/0."
  }
}

variable "platform_node_group" {
  description = "CPU node group for api, worker, console and the add-ons."
  type = object({
    instance_types = list(string)
    min_size       = number
    max_size       = number
    desired_size   = number
    disk_size_gb   = number
  })

  validation {
    condition     = var.platform_node_group.min_size >= 1 && var.platform_node_group.max_size >= var.platform_node_group.min_size
    error_message = "platform_node_group needs min_size >= 1 and max_size >= min_size."
  }
}

variable "gpu_node_groups" {
  description = "GPU pools by name (see the cluster module): instance types, GPUs per node, sizes, capacity type, disk."
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
    condition     = length(var.gpu_node_groups) >= 1
    error_message = "At least one GPU pool is needed to run engine replicas."
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
  description = "Pinned EKS add-on versions matching kubernetes_version (coredns, kube-proxy, vpc-cni, aws-ebs-csi-driver, aws-efs-csi-driver)."
  type        = map(string)

  validation {
    condition     = alltrue([for v in values(var.addon_versions) : can(regex("^v[0-9]+\\.[0-9]+\\.[0-9]+-eksbuild\\.[0-9]+$", v))])
    error_message = "Add-on versions must be vX.Y.Z-eksbuild.N."
  }
}

variable "chart_versions" {
  description = "Pinned Helm chart versions of every add-on, by chart name."
  type        = map(string)

  validation {
    condition = (
      length(setsubtract(["nvidia-device-plugin", "cluster-autoscaler", "aws-load-balancer-controller", "external-secrets", "keda", "kube-prometheus-stack", "aws-for-fluent-bit", "dcgm-exporter", "karpenter"], keys(var.chart_versions))) == 0 &&
      alltrue([for v in values(var.chart_versions) : can(regex("^[0-9]+\\.[0-9]+\\.[0-9]+$", v))])
    )
    error_message = "chart_versions needs every add-on chart (nvidia-device-plugin, cluster-autoscaler, aws-load-balancer-controller, external-secrets, keda, kube-prometheus-stack, aws-for-fluent-bit, dcgm-exporter, karpenter) as an exact X.Y.Z."
  }
}

variable "database" {
  description = "RDS PostgreSQL: engine version, class, storage, Multi-AZ, deletion protection, backups, master password rotation."
  type = object({
    engine_version         = string
    instance_class         = string
    allocated_storage_gb   = number
    multi_az               = bool
    deletion_protection    = bool
    backup_retention_days  = number
    password_rotation_days = number
  })

  validation {
    condition     = can(regex("^(1[6-9])\\.[0-9]+$", var.database.engine_version)) && var.database.backup_retention_days >= 1
    error_message = "database needs PostgreSQL 16 or newer and at least one day of backups."
  }
}

variable "cache" {
  description = "ElastiCache Redis: engine version, node type, read replicas."
  type = object({
    engine_version = string
    node_type      = string
    replicas       = number
  })

  validation {
    condition     = var.cache.replicas >= 0 && var.cache.replicas <= 5
    error_message = "cache.replicas must be 0-5."
  }
}

variable "bucket_name" {
  description = "Globally unique name of the platform's bucket."
  type        = string

  validation {
    condition     = can(regex("^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$", var.bucket_name))
    error_message = "bucket_name must be a valid S3 bucket name."
  }
}

variable "noncurrent_version_days" {
  description = "Days old object versions are kept."
  type        = number

  validation {
    condition     = var.noncurrent_version_days >= 1
    error_message = "noncurrent_version_days must be at least 1."
  }
}

variable "cors_allowed_origins" {
  description = "https origins allowed to PUT presigned upload parts from a browser."
  type        = list(string)

  validation {
    condition     = alltrue([for o in var.cors_allowed_origins : can(regex("^https://", o))])
    error_message = "cors_allowed_origins must be https:// origins."
  }
}

variable "api_replicas" {
  description = "Bounds of the API's HorizontalPodAutoscaler; the database's max_connections is sized for max."
  type = object({
    min = number
    max = number
  })

  validation {
    condition     = var.api_replicas.min >= 2 && var.api_replicas.max >= var.api_replicas.min && var.api_replicas.max <= 50
    error_message = "api_replicas needs 2 <= min <= max <= 50 (two keep the PodDisruptionBudget satisfiable)."
  }
}

variable "worker_replicas" {
  description = "Celery worker pods (each holds one database pool)."
  type        = number

  validation {
    condition     = var.worker_replicas >= 1 && var.worker_replicas <= 20
    error_message = "worker_replicas must be 1-20."
  }
}

variable "log_retention_days" {
  description = "Days to keep every log group (control plane, flow logs, database, containers)."
  type        = number

  validation {
    condition     = contains([1, 3, 5, 7, 14, 30, 60, 90, 120, 150, 180, 365, 400, 545, 731, 1096, 1827, 2192, 2557, 2922, 3288, 3653], var.log_retention_days)
    error_message = "log_retention_days must be a retention CloudWatch accepts (1, 3, 5, 7, 14, 30, 60, 90, ...)."
  }
}

variable "prometheus" {
  description = "Prometheus retention (days) and volume size (GiB)."
  type = object({
    retention_days = number
    storage_gb     = number
  })

  validation {
    condition     = var.prometheus.retention_days >= 1 && var.prometheus.storage_gb >= 10
    error_message = "prometheus needs retention_days >= 1 and storage_gb >= 10."
  }
}

variable "api_certificate_arn" {
  description = "ACM certificate ARN of the API's hostname: the API and console are served over HTTPS only (HTTP redirects)."
  type        = string

  validation {
    condition = (
      can(regex("^arn:aws(-[a-z]+)*:acm:[a-z]{2}(-[a-z]+)+-[0-9]:[0-9]{12}:certificate/[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$", var.api_certificate_arn)) &&
      !can(regex(":(111122223333|123456789012|000000000000|444455556666):", var.api_certificate_arn)) &&
      !can(regex("/00000000-0000-0000-0000-000000000000$", var.api_certificate_arn))
    )
    error_message = "api_certificate_arn must be the ARN of a real ACM certificate (arn:aws:acm:REGION:ACCOUNT:certificate/UUID); documentation placeholders are refused."
  }
}

variable "api_allowed_cidrs" {
  description = "Client CIDRs the API's load balancer accepts (0.0.0.0/0 only if you mean the whole internet)."
  type        = list(string)

  validation {
    condition     = length(var.api_allowed_cidrs) > 0 && alltrue([for c in var.api_allowed_cidrs : can(cidrhost(c, 0))])
    error_message = "api_allowed_cidrs must list at least one valid CIDR."
  }
}

variable "budget" {
  description = "Monthly cost budget of the environment in USD, and who is mailed at 80% forecast and 100% actual."
  type = object({
    monthly_usd = number
    emails      = list(string)
  })

  validation {
    condition     = var.budget.monthly_usd > 0 && length(var.budget.emails) > 0 && alltrue([for e in var.budget.emails : can(regex("^[^@ ]+@[^@ ]+\\.[^@ ]+$", e))])
    error_message = "budget needs a positive monthly_usd and at least one email address."
  }
}

variable "gpu_provisioner" {
  description = "What makes the GPU nodes: \"node_groups\" (a managed node group per pool, scaled by the Cluster Autoscaler; capacity blocks) or \"karpenter\" (a NodePool per pool: spot and on-demand, consolidation)."
  type        = string
  default     = "node_groups"

  validation {
    condition     = contains(["node_groups", "karpenter"], var.gpu_provisioner)
    error_message = "gpu_provisioner must be node_groups or karpenter."
  }
}
