variable "name" {
  description = "Replication group id and prefix of its companions."
  type        = string

  validation {
    condition     = can(regex("^[a-z][a-z0-9-]{2,38}$", var.name))
    error_message = "name must be 3-39 characters of lowercase letters, digits and dashes, starting with a letter."
  }
}

variable "engine_version" {
  description = "Redis OSS <major>.<minor> (7.0 or newer)."
  type        = string

  validation {
    condition     = can(regex("^7\\.[0-9]+$", var.engine_version))
    error_message = "engine_version must be Redis 7.x, as <major>.<minor>."
  }
}

variable "node_type" {
  description = "ElastiCache node type, e.g. cache.t4g.small (dev) or cache.r7g.large (prod)."
  type        = string

  validation {
    condition     = can(regex("^cache\\.[a-z0-9]+\\.[0-9]*x?(micro|small|medium|large)$", var.node_type))
    error_message = "node_type must be an ElastiCache node type such as cache.r7g.large."
  }
}

variable "replicas" {
  description = "Read replicas beside the primary; 1 or more turns on automatic failover across zones (prod)."
  type        = number

  validation {
    condition     = var.replicas >= 0 && var.replicas <= 5
    error_message = "replicas must be 0-5."
  }
}

variable "vpc_id" {
  description = "VPC of the cache."
  type        = string

  validation {
    condition     = can(regex("^vpc-[0-9a-f]+$", var.vpc_id))
    error_message = "vpc_id must be a VPC ID (vpc-...)."
  }
}

variable "subnet_group_name" {
  description = "ElastiCache subnet group (the network module's cache subnets)."
  type        = string

  validation {
    condition     = length(var.subnet_group_name) > 0 && length(var.subnet_group_name) <= 255
    error_message = "subnet_group_name must be 1-255 characters."
  }
}

variable "client_security_group_id" {
  description = "Security group of the EKS nodes, the only one allowed to connect."
  type        = string

  validation {
    condition     = can(regex("^sg-[0-9a-f]+$", var.client_security_group_id))
    error_message = "client_security_group_id must be a security group ID (sg-...)."
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
